//! Reading one-element tensors as the numbers structured-writer configs compare: data
//! conditions (integers and bools, truncated to 32 bits as the reference compares them) and
//! TD-error priorities (any real).

use crate::tensor::TensorView;
use reverb_proto::tensorflow::DataType;

/// Whether `dtype` is an integer or bool type (what data conditions compare).
pub fn integral(dtype: i32) -> bool {
    use DataType::*;
    [
        DtInt8, DtInt16, DtInt32, DtInt64, DtUint8, DtUint16, DtUint32, DtUint64, DtBool,
    ]
    .iter()
    .any(|d| *d as i32 == dtype)
}

/// The first element's bytes of `t`, if it has `n` of them.
fn first<const N: usize>(t: &TensorView<'_>) -> Option<[u8; N]> {
    t.data.get(..N)?.try_into().ok()
}

/// The value of a one-element tensor as an integer (truncated to 32 bits, as the reference
/// compares), if it is an integer or bool.
pub fn integer(t: &TensorView<'_>) -> Option<i64> {
    use DataType::*;
    let v = match DataType::try_from(t.dtype).ok()? {
        DtBool => (first::<1>(t)?[0] != 0) as i64,
        DtInt8 => i8::from_le_bytes(first(t)?) as i64,
        DtUint8 => u8::from_le_bytes(first(t)?) as i64,
        DtInt16 => i16::from_le_bytes(first(t)?) as i64,
        DtUint16 => u16::from_le_bytes(first(t)?) as i64,
        DtInt32 => i32::from_le_bytes(first(t)?) as i64,
        DtUint32 => u32::from_le_bytes(first(t)?) as i32 as i64,
        DtInt64 => i64::from_le_bytes(first(t)?) as i32 as i64,
        DtUint64 => u64::from_le_bytes(first(t)?) as i32 as i64,
        _ => return None,
    };
    Some(v)
}

/// The value of a one-element real (or integer, or bool) tensor as a float.
pub fn number(t: &TensorView<'_>) -> Option<f64> {
    use DataType::*;
    let v = match DataType::try_from(t.dtype).ok()? {
        DtFloat => f32::from_le_bytes(first(t)?) as f64,
        DtDouble => f64::from_le_bytes(first(t)?),
        DtBool => (first::<1>(t)?[0] != 0) as i64 as f64,
        DtInt8 => i8::from_le_bytes(first(t)?) as f64,
        DtUint8 => u8::from_le_bytes(first(t)?) as f64,
        DtInt16 => i16::from_le_bytes(first(t)?) as f64,
        DtUint16 => u16::from_le_bytes(first(t)?) as f64,
        DtInt32 => i32::from_le_bytes(first(t)?) as f64,
        DtUint32 => u32::from_le_bytes(first(t)?) as f64,
        DtInt64 => i64::from_le_bytes(first(t)?) as f64,
        DtUint64 => u64::from_le_bytes(first(t)?) as f64,
        _ => return None,
    };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tensor::AsView;
    use crate::Tensor;

    #[test]
    fn scalars_read_as_the_reference_reads_them() {
        let t = |dtype: DataType, data: Vec<u8>| Tensor {
            dtype: dtype as i32,
            shape: vec![],
            data,
        };
        let number = |t: &Tensor| number(&t.view());
        let integer = |t: &Tensor| integer(&t.view());
        let big = t(DataType::DtUint32, 3_000_000_000u32.to_le_bytes().to_vec());
        assert_eq!(number(&big), Some(3e9));
        assert_eq!(integer(&big), Some(3_000_000_000u32 as i32 as i64));
        assert_eq!(integer(&t(DataType::DtBool, vec![1])), Some(1));
        assert_eq!(
            number(&t(DataType::DtFloat, 2.5f32.to_le_bytes().to_vec())),
            Some(2.5)
        );
        assert_eq!(
            integer(&t(DataType::DtFloat, 2.5f32.to_le_bytes().to_vec())),
            None
        );
        // Malformed tensors (too few bytes) are no value, not a panic.
        assert_eq!(integer(&t(DataType::DtBool, vec![])), None);
        assert_eq!(number(&t(DataType::DtInt64, vec![1, 2])), None);
    }
}
