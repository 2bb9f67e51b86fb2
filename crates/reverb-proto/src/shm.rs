//! The shared-memory sample transport (not in the reference), for a client and server on one
//! host: the sampling client offers a ring (a sealed `memfd`) in the `SampleStream` call's
//! metadata; a server that can open it writes large chunks' bytes there and sends only their
//! position (`ChunkData.shm_position` / `shm_length`); the client reports what it has consumed
//! (`SampleStreamRequest.shm_released`). The server never waits for ring space: when the ring is
//! full (or cannot be opened) it sends the bytes inline, as the reference does. Servers that do
//! not know the metadata ignore it.

/// The metadata key of the offer.
pub const METADATA_KEY: &str = "reverb-shm-ring";
/// The `memfd` name; the server only opens descriptors whose link names it.
pub const MEMFD_NAME: &str = "reverb-ring";
/// The first page holds the offer's token; ring data starts after it.
pub const DATA_OFFSET: usize = 4096;
/// Random bytes at the start of the file, sent in the offer: proof that the server opened the
/// client's ring and not another process's file.
pub const TOKEN_LEN: usize = 16;
/// Chunks smaller than this are sent inline (the copy costs less than the bookkeeping).
pub const MIN_CHUNK_BYTES: usize = 4096;
/// Bounds of the ring size a server accepts.
pub const MIN_RING_BYTES: u64 = 1 << 20;
pub const MAX_RING_BYTES: u64 = 256 << 20;

/// What the client offers: its pid, the ring's descriptor, the data size and the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingOffer {
    pub pid: u32,
    pub fd: i32,
    pub size: u64,
    pub token: [u8; TOKEN_LEN],
}

impl RingOffer {
    /// `pid:fd:size:token-hex`.
    pub fn encode(&self) -> String {
        let token: String = self.token.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{}:{}:{token}", self.pid, self.fd, self.size)
    }

    /// Parses [`RingOffer::encode`]'s form; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let pid = parts.next()?.parse().ok()?;
        let fd = parts.next()?.parse().ok()?;
        let size = parts.next()?.parse().ok()?;
        let hex = parts.next()?;
        if parts.next().is_some() || hex.len() != 2 * TOKEN_LEN || !hex.is_ascii() {
            return None;
        }
        let mut token = [0u8; TOKEN_LEN];
        for (i, b) in token.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Self {
            pid,
            fd,
            size,
            token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_round_trip_and_junk_is_refused() {
        let offer = RingOffer {
            pid: 42,
            fd: 7,
            size: 1 << 25,
            token: [0xab; TOKEN_LEN],
        };
        assert_eq!(RingOffer::parse(&offer.encode()), Some(offer.clone()));
        for junk in [
            "",
            "1:2:3",
            "1:2:3:zz",
            "a:2:3:00",
            &format!("{}:x", offer.encode()),
        ] {
            assert_eq!(RingOffer::parse(junk), None, "{junk}");
        }
        let short = offer.encode();
        assert_eq!(RingOffer::parse(&short[..short.len() - 2]), None);
    }
}
