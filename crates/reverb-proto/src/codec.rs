//! The gRPC codec of every Reverb RPC: prost's, except that the encoder reserves a message's
//! whole encoded size before writing it. tonic's own prost encoder lets its buffer grow while
//! a message is written, so a multi-megabyte sample response or insert request (mostly chunk
//! bytes) was copied about twice instead of once.

use prost::Message;
use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic::Status;
use tonic_prost::ProstCodec;

/// `application/grpc+proto` through prost, with encoding into a pre-sized buffer.
#[derive(Debug, Clone)]
pub struct ReverbCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for ReverbCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for ReverbCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}

/// Encodes a prost message after reserving its encoded length.
#[derive(Debug, Clone)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("Error encoding a message: {e}")))
    }
}
