//! Reading checkpoints that dm-reverb 0.14 wrote, so users can move a running experiment over.
//!
//! Its layout: `<root>/<RFC 3339 time>/` holding `tables.tfrecord` (`PriorityTableCheckpoint`),
//! `chunks.tfrecord` (`ChunkData`), `items.tfrecord` (`PrioritizedItem`, per table in insertion
//! order) and an empty `DONE` written last. The files are TFRecord files, normally ZLIB
//! compressed; each record is `len: u64 LE | masked crc32c(len) | data | masked crc32c(data)`.
//! The messages are the ones our own checkpoints hold, so records feed the same
//! [`Assembler`] and restored items are checked as ours are.

use bytes::Bytes;
use flate2::read::ZlibDecoder;
use prost::Message;
use reverb_core::checkpoint::{corrupt, Assembler, SavedTable};
use reverb_core::{ChunkStore, CoreError};
use reverb_proto::{ChunkData, PrioritizedItem, PriorityTableCheckpoint};
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::sync::Arc;

/// The files of a dm-reverb checkpoint, in the order they are read.
const TABLES: &str = "tables.tfrecord";
const CHUNKS: &str = "chunks.tfrecord";
const ITEMS: &str = "items.tfrecord";
const DONE: &str = "DONE";

/// Whether `dir` looks like a checkpoint dm-reverb wrote (complete or not).
pub fn is_dm_checkpoint(dir: &Path) -> bool {
    dir.join(TABLES).is_file()
}

/// Whether `dir` is a complete dm-reverb checkpoint (its `DONE` marker written).
pub fn is_complete(dir: &Path) -> bool {
    is_dm_checkpoint(dir) && dir.join(DONE).is_file()
}

/// Reads a whole dm-reverb checkpoint directory, verifying every record's checksums. A
/// checkpoint without its `DONE` marker (its save did not finish), a truncated or corrupt file,
/// or an item its chunks cannot serve is refused as a whole. With `store`, the chunks'
/// payloads go to it as they are read.
pub fn read(
    dir: &Path,
    store: Option<&Arc<ChunkStore>>,
) -> Result<BTreeMap<String, SavedTable>, CoreError> {
    if !dir.join(DONE).is_file() {
        return Err(corrupt(format!(
            "{} has no {DONE} marker: dm-reverb did not finish writing it",
            dir.display()
        )));
    }
    let mut saved = Assembler::storing(store.cloned());
    for_each_record(&dir.join(TABLES), |r| {
        saved.table(PriorityTableCheckpoint::decode(r).map_err(corrupt)?);
        Ok(())
    })?;
    for_each_record(&dir.join(CHUNKS), |r| {
        saved.chunk(ChunkData::decode(r).map_err(corrupt)?)
    })?;
    for_each_record(&dir.join(ITEMS), |r| {
        saved.item(&PrioritizedItem::decode(r).map_err(corrupt)?)
    })?;
    Ok(saved.finish())
}

/// Writes the dm-reverb checkpoint in `dir` to `out` in our checkpoint format, one record at
/// a time (memory stays bounded whatever the checkpoint's size), verifying every record's
/// checksums; a checkpoint without its `DONE` marker, or a truncated or corrupt file, is
/// refused. Items are checked against their chunks when they are read.
pub fn convert(dir: &Path, out: impl std::io::Write) -> Result<(), CoreError> {
    if !dir.join(DONE).is_file() {
        return Err(corrupt(format!(
            "{} has no {DONE} marker: dm-reverb did not finish writing it",
            dir.display()
        )));
    }
    let io = |e: std::io::Error| corrupt(format!("cannot write the converted checkpoint: {e}"));
    let mut writer = reverb_core::checkpoint::RecordWriter::new(out).map_err(io)?;
    for_each_record(&dir.join(TABLES), |r| writer.table(&r).map_err(io))?;
    for_each_record(&dir.join(CHUNKS), |r| writer.chunk(&r).map_err(io))?;
    for_each_record(&dir.join(ITEMS), |r| writer.item(&r).map_err(io))?;
    writer.finish().map_err(io)?;
    Ok(())
}

/// Calls `f` with each record of the TFRecord file at `path` (ZLIB compressed or not).
fn for_each_record(
    path: &Path,
    mut f: impl FnMut(Bytes) -> Result<(), CoreError>,
) -> Result<(), CoreError> {
    let name = path.display();
    let file = fs::File::open(path).map_err(|e| corrupt(format!("cannot open {name}: {e}")))?;
    let mut file = BufReader::with_capacity(1 << 20, file);
    let head = file
        .fill_buf()
        .map_err(|e| corrupt(format!("cannot read {name}: {e}")))?;
    // A zlib stream starts with a CMF byte of deflate with a 32 KiB window (0x78) and a header
    // checksum; a plain TFRecord file starts with a record length.
    let zlib =
        head.len() >= 2 && head[0] == 0x78 && u16::from_be_bytes([head[0], head[1]]) % 31 == 0;
    let mut input: Box<dyn Read> = if zlib {
        Box::new(BufReader::with_capacity(1 << 20, ZlibDecoder::new(file)))
    } else {
        Box::new(file)
    };
    let mut index = 0u64;
    loop {
        let at = |what: &str| corrupt(format!("{name}: record {index} {what}"));
        let mut head = [0u8; 12];
        match read_full(&mut input, &mut head) {
            Ok(0) => return Ok(()),
            Ok(12) => {}
            Ok(_) => return Err(at("is truncated")),
            Err(e) => return Err(at(&format!("cannot be read: {e}"))),
        }
        let (len, len_crc) = head.split_at(8);
        if masked_crc(len) != u32::from_le_bytes(len_crc.try_into().unwrap()) {
            return Err(at("fails its length checksum"));
        }
        let len = u64::from_le_bytes(len.try_into().unwrap());
        // Read up to `len` bytes without trusting `len` for the allocation.
        let mut data = Vec::new();
        (&mut input)
            .take(len)
            .read_to_end(&mut data)
            .map_err(|e| at(&format!("cannot be read: {e}")))?;
        let mut crc = [0u8; 4];
        if data.len() as u64 != len || read_full(&mut input, &mut crc).ok() != Some(4) {
            return Err(at("is truncated"));
        }
        if masked_crc(&data) != u32::from_le_bytes(crc) {
            return Err(at("fails its data checksum"));
        }
        f(Bytes::from(data))?;
        index += 1;
    }
}

/// Fills `buf` unless the input ends first; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// TFRecord's masked CRC-32C.
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// The time a checkpoint directory is named by, as (seconds since 1970 in UTC, nanoseconds),
/// for ordering: dm-reverb's RFC 3339 names in the machine's time zone
/// (`2026-12-06T18:26:11.769042166+00:00`, `...T19:26:11.5+01:00`, fraction optional) and ours
/// (`2026-12-06T18-26-11.600000000Z`).
pub fn checkpoint_time(name: &str) -> Option<(i64, u32)> {
    let (rest, offset) = if let Some(rest) = name.strip_suffix('Z') {
        (rest, 0)
    } else {
        let at = name.len().checked_sub(6)?;
        let (rest, zone) = (name.get(..at)?, name.get(at..)?);
        if !zone.is_ascii() {
            return None;
        }
        let z = zone.as_bytes();
        let sign = match z[0] {
            b'+' => 1,
            b'-' => -1,
            _ => return None,
        };
        if z[3] != b':' {
            return None;
        }
        let hours: i64 = zone[1..3].parse().ok()?;
        let minutes: i64 = zone[4..6].parse().ok()?;
        (rest, sign * (hours * 3600 + minutes * 60))
    };
    let (whole, fraction) = rest.split_once('.').unwrap_or((rest, ""));
    let b = whole.as_bytes();
    if b.len() != 19 || b[10] != b'T' || [4, 7].iter().any(|&i| b[i] != b'-') {
        return None;
    }
    if ![13, 16].iter().all(|&i| b[i] == b':' || b[i] == b'-') {
        return None;
    }
    let number = |at: usize, len: usize| -> Option<i64> {
        let digits = whole.get(at..at + len)?;
        digits
            .bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| digits.parse().ok())?
    };
    let (year, month, day) = (number(0, 4)?, number(5, 2)?, number(8, 2)?);
    let (hour, minute, second) = (number(11, 2)?, number(14, 2)?, number(17, 2)?);
    if fraction.len() > 9 || !fraction.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let nanos = format!("{fraction:0<9}").parse().ok()?;
    let days = days_from_civil(year, month, day);
    Some((
        days * 86_400 + hour * 3600 + minute * 60 + second - offset,
        nanos,
    ))
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tf.io.TFRecordWriter` writing the record `hello`, byte for byte.
    const HELLO: &str = "0500000000000000eab2043e68656c6c6fbb1f1c19";

    fn records(bytes: &[u8]) -> Result<Vec<Bytes>, CoreError> {
        let dir = std::env::temp_dir().join(format!("tfrecord-test-{}", rand::random::<u64>()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.tfrecord");
        fs::write(&path, bytes).unwrap();
        let mut out = Vec::new();
        let result = for_each_record(&path, |r| {
            out.push(r);
            Ok(())
        });
        fs::remove_dir_all(&dir).unwrap();
        result.map(|()| out)
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn reads_what_tensorflow_writes_plain_and_zlib_compressed() {
        let plain = hex(HELLO).repeat(2);
        assert_eq!(records(&plain).unwrap(), vec![&b"hello"[..], &b"hello"[..]]);
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut zlib, &plain).unwrap();
        let zlib = zlib.finish().unwrap();
        assert_eq!(records(&zlib).unwrap().len(), 2);
        assert_eq!(records(&[]).unwrap().len(), 0);
    }

    #[test]
    fn truncated_or_flipped_records_are_refused() {
        let plain = hex(HELLO);
        for cut in [3, 12, 15, plain.len() - 1] {
            let err = records(&plain[..cut]).unwrap_err().to_string();
            assert!(err.contains("record 0 is truncated"), "{cut}: {err}");
        }
        for (at, what) in [
            (2, "length checksum"),
            (13, "data checksum"),
            (19, "data checksum"),
        ] {
            let mut bad = plain.clone();
            bad[at] ^= 1;
            let err = records(&bad).unwrap_err().to_string();
            assert!(err.contains(what), "{at}: {err}");
        }
    }

    #[test]
    fn names_order_by_time() {
        let a = checkpoint_time("2026-12-06T18:26:11.5+00:00").unwrap();
        let b = checkpoint_time("2026-12-06T18:26:11.769042166+00:00").unwrap();
        let c = checkpoint_time("2026-12-06T18:26:12+00:00").unwrap();
        let ours = checkpoint_time("2026-12-06T18-26-11.600000000Z").unwrap();
        assert!(a < ours && ours < b && b < c);
        for bad in [
            "backup",
            "2026-12-06T18:26:11.5",
            "2026-12-06T18:26:11.1234567891+00:00",
        ] {
            assert_eq!(checkpoint_time(bad), None, "{bad}");
        }
    }
}
