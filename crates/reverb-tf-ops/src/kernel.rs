//! Safe wrappers over the C API: statuses, attribute reads, input and output tensors, and the
//! registration of ops and of kernels implementing [`Kernel`].

use crate::ffi::*;
use reverb_client::ClientError;
use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

/// Canonical status codes used here (the same numbers in TF and gRPC).
pub mod code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
}

/// An error for TensorFlow: a canonical code and a message.
#[derive(Debug, Clone)]
pub struct Error {
    pub code: i32,
    pub message: String,
}

impl Error {
    pub fn invalid(message: impl Into<String>) -> Self {
        Self {
            code: code::INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        let code = match e.code as i32 {
            // OK is no failure, and OUT_OF_RANGE would end a tf.data iteration silently.
            0 => code::INTERNAL,
            code::OUT_OF_RANGE => code::FAILED_PRECONDITION,
            c => c,
        };
        Self {
            code,
            message: e.message,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// An owned `TF_Status`.
struct Status(*mut TF_Status);

impl Status {
    fn new() -> Self {
        // SAFETY: TF_NewStatus has no preconditions and returns an owned status.
        Self(unsafe { TF_NewStatus() })
    }

    fn from_error(e: &Error) -> Self {
        let s = Self::new();
        let msg = CString::new(e.message.replace('\0', " ")).expect("no NUL left");
        // SAFETY: s.0 is a live status; TF copies the message.
        unsafe { TF_SetStatus(s.0, e.code, msg.as_ptr()) };
        s
    }

    fn check(&self) -> Result<()> {
        // SAFETY: self.0 is a live status; the message pointer is valid while it lives and is
        // copied out at once.
        unsafe {
            let code = TF_GetCode(self.0);
            if code == 0 {
                return Ok(());
            }
            let msg = CStr::from_ptr(TF_Message(self.0))
                .to_string_lossy()
                .into_owned();
            Err(Error { code, message: msg })
        }
    }
}

impl Drop for Status {
    fn drop(&mut self) {
        // SAFETY: we own the status.
        unsafe { TF_DeleteStatus(self.0) }
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("attribute and op names contain no NUL")
}

type ScalarGetter<T> =
    unsafe extern "C" fn(*mut TF_OpKernelConstruction, *const c_char, *mut T, *mut TF_Status);
type ListGetter<T> = unsafe extern "C" fn(
    *mut TF_OpKernelConstruction,
    *const c_char,
    *mut T,
    c_int,
    *mut TF_Status,
);

/// Kernel construction: reads the node's attributes.
pub struct Construction(*mut TF_OpKernelConstruction);

/// How a kernel's clients connect: an auth token and TLS files (empty attrs: none, then the
/// `REVERB_AUTH_TOKEN` / `REVERB_TLS_*` defaults apply).
#[derive(Clone, Debug)]
pub struct Connection {
    token: Option<String>,
    tls_ca: Option<String>,
    tls_cert: Option<String>,
    tls_key: Option<String>,
}

impl Connection {
    /// A client of `address`.
    pub fn client(&self, address: &str) -> Result<reverb_client::Client> {
        let mut client = reverb_client::Client::new(address)?;
        if let Some(token) = &self.token {
            client = client.with_auth_token(Some(token))?;
        }
        let (ca, cert, key) = (&self.tls_ca, &self.tls_cert, &self.tls_key);
        if ca.is_some() || cert.is_some() || key.is_some() {
            let server_name = reverb_proto::tls::env_path(reverb_proto::tls::ENV_SERVER_NAME);
            let tls = reverb_client::transport::tls::Tls::from_paths(
                ca.as_deref(),
                cert.as_deref(),
                key.as_deref(),
                server_name.as_deref(),
            )
            .map_err(reverb_client::ClientError::invalid)?;
            client = client.with_tls(tls)?;
        }
        Ok(client)
    }

    /// One client per address of `addresses`, a comma-separated list (the shards of a
    /// sharded dataset).
    pub fn clients(&self, addresses: &str) -> Result<Vec<reverb_client::Client>> {
        addresses
            .split(',')
            .map(|address| self.client(address.trim()))
            .collect()
    }
}

impl Construction {
    fn size(&self, name: &str) -> Result<(i32, i32)> {
        let (mut list, mut total) = (0i32, 0i32);
        let status = Status::new();
        let n = cstr(name);
        // SAFETY: self.0 is the live construction TF passed to create(); out-params are locals.
        unsafe {
            TF_OpKernelConstruction_GetAttrSize(self.0, n.as_ptr(), &mut list, &mut total, status.0)
        };
        status.check()?;
        Ok((list, total))
    }

    /// The client of the `server_address` attr, sending the `auth_token` attr (when not
    /// empty; else `REVERB_AUTH_TOKEN`'s value, if any), over TLS when the `tls_ca` attr
    /// names an authority (with `tls_cert`/`tls_key`; else as `REVERB_TLS_*` say).
    pub fn client(&self) -> Result<reverb_client::Client> {
        self.client_of(&self.string("server_address")?)
    }

    fn client_of(&self, address: &str) -> Result<reverb_client::Client> {
        self.connection()?.client(address)
    }

    /// How clients connect (the `auth_token` and `tls_*` attrs), for clients made later.
    pub fn connection(&self) -> Result<Connection> {
        let attr = |name| self.string(name).map(|v| (!v.is_empty()).then_some(v));
        Ok(Connection {
            token: attr("auth_token")?,
            tls_ca: attr("tls_ca")?,
            tls_cert: attr("tls_cert")?,
            tls_key: attr("tls_key")?,
        })
    }

    /// A `string` attribute.
    pub fn string(&self, name: &str) -> Result<String> {
        let (_, total) = self.size(name)?;
        let mut buf = vec![0u8; total.max(0) as usize + 1];
        let status = Status::new();
        let n = cstr(name);
        // SAFETY: buf holds `total` bytes plus one; TF writes at most max_length bytes.
        unsafe {
            TF_OpKernelConstruction_GetAttrString(
                self.0,
                n.as_ptr(),
                buf.as_mut_ptr() as *mut c_char,
                total.max(0) as usize,
                status.0,
            )
        };
        status.check()?;
        buf.truncate(total.max(0) as usize);
        String::from_utf8(buf).map_err(|_| Error::invalid(format!("attr {name} is not UTF-8")))
    }

    /// A scalar attribute read by `get` (one of the `GetAttr<Scalar>` functions).
    fn scalar<T: Copy + Default>(&self, name: &str, get: ScalarGetter<T>) -> Result<T> {
        let mut v = T::default();
        let status = Status::new();
        let n = cstr(name);
        // SAFETY: live construction; `get` writes one T into the local out-param.
        unsafe { get(self.0, n.as_ptr(), &mut v, status.0) };
        status.check()?;
        Ok(v)
    }

    /// A list attribute read by `get` (one of the `GetAttr<Scalar>List` functions).
    fn list<T: Copy + Default>(&self, name: &str, get: ListGetter<T>) -> Result<Vec<T>> {
        let (len, _) = self.size(name)?;
        let mut v = vec![T::default(); len.max(0) as usize];
        let status = Status::new();
        let n = cstr(name);
        // SAFETY: v has room for `len` values and TF writes at most max_vals.
        unsafe { get(self.0, n.as_ptr(), v.as_mut_ptr(), len as c_int, status.0) };
        status.check()?;
        Ok(v)
    }

    /// An `int` attribute.
    pub fn int(&self, name: &str) -> Result<i64> {
        self.scalar(name, TF_OpKernelConstruction_GetAttrInt64)
    }

    /// A `bool` attribute (TF_Bool is an unsigned char).
    pub fn bool(&self, name: &str) -> Result<bool> {
        Ok(self.scalar(name, TF_OpKernelConstruction_GetAttrBool)? != 0)
    }

    /// A `list(type)` attribute.
    pub fn types(&self, name: &str) -> Result<Vec<i32>> {
        self.list(name, TF_OpKernelConstruction_GetAttrTypeList)
    }

    /// A `list(int)` attribute.
    pub fn ints(&self, name: &str) -> Result<Vec<i64>> {
        self.list(name, TF_OpKernelConstruction_GetAttrInt64List)
    }

    /// A `list(string)` attribute, as UTF-8 (invalid sequences replaced).
    pub fn strings(&self, name: &str) -> Result<Vec<String>> {
        Ok(self
            .byte_strings(name)?
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect())
    }

    /// A `list(string)` attribute, as bytes (e.g. serialized protos).
    pub fn byte_strings(&self, name: &str) -> Result<Vec<Vec<u8>>> {
        let (len, total) = self.size(name)?;
        let len = len.max(0) as usize;
        let mut values = vec![ptr::null_mut::<c_char>(); len];
        let mut lengths = vec![0usize; len];
        let mut storage = vec![0u8; total.max(0) as usize];
        let status = Status::new();
        let n = cstr(name);
        // SAFETY: values/lengths hold `len` entries and storage `total` bytes, as TF requires;
        // TF points values[i] into storage.
        unsafe {
            TF_OpKernelConstruction_GetAttrStringList(
                self.0,
                n.as_ptr(),
                values.as_mut_ptr(),
                lengths.as_mut_ptr(),
                len as c_int,
                storage.as_mut_ptr() as *mut c_void,
                storage.len(),
                status.0,
            )
        };
        status.check()?;
        Ok(values
            .iter()
            .zip(&lengths)
            .map(|(&p, &l)| {
                // SAFETY: TF set p to `l` valid bytes inside `storage`, which is still alive.
                unsafe { std::slice::from_raw_parts(p as *const u8, l) }.to_vec()
            })
            .collect())
    }
}

/// An input tensor (a reference TF hands out; released on drop).
pub struct Input(*mut TF_Tensor);

impl Input {
    pub fn dtype(&self) -> i32 {
        // SAFETY: self.0 is a live tensor.
        unsafe { TF_TensorType(self.0) }
    }

    pub fn shape(&self) -> Vec<i64> {
        // SAFETY: self.0 is a live tensor; indices are below its rank.
        unsafe { (0..TF_NumDims(self.0)).map(|i| TF_Dim(self.0, i)).collect() }
    }

    /// The raw bytes of a numeric tensor.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: TF_TensorData points at TF_TensorByteSize bytes that live as long as the
        // tensor; a zero-sized tensor may give a null pointer, handled here.
        unsafe {
            let n = TF_TensorByteSize(self.0);
            let p = TF_TensorData(self.0) as *const u8;
            if n == 0 || p.is_null() {
                &[]
            } else {
                std::slice::from_raw_parts(p, n)
            }
        }
    }

    /// The elements of a `string` tensor, read from TensorFlow's `TF_TString` layout: 24 bytes
    /// per element, the type in the low two bits of the first byte. Only read, never modified.
    pub fn strings(&self) -> Result<Vec<Vec<u8>>> {
        const DT_STRING: i32 = 7;
        if self.dtype() != DT_STRING {
            return Err(Error::invalid("expected a string tensor"));
        }
        let raw = self.bytes();
        let word = |b: &[u8], at: usize| usize::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let mut out = Vec::with_capacity(raw.len() / 24);
        for (i, s) in raw.chunks_exact(24).enumerate() {
            let (len, data): (usize, *const u8) = match s[0] & 3 {
                // SMALL: size << 2 in the first byte, the bytes inline after it.
                0 => ((s[0] >> 2) as usize, s[1..].as_ptr()),
                // LARGE: {size << 2, capacity, pointer}.
                1 => (word(s, 0) >> 2, word(s, 16) as *const u8),
                // OFFSET: {u32 size << 2, u32 offset from this element, u32 count}.
                2 => {
                    let size = u32::from_le_bytes(s[0..4].try_into().unwrap()) as usize >> 2;
                    let offset = u32::from_le_bytes(s[4..8].try_into().unwrap()) as usize;
                    if i * 24 + offset + size > raw.len() {
                        return Err(Error::invalid("malformed string tensor"));
                    }
                    // SAFETY: the offset is relative to this element, inside the tensor buffer.
                    (size, unsafe { raw.as_ptr().add(i * 24 + offset) })
                }
                // VIEW: {size << 2, pointer, ...}.
                _ => (word(s, 0) >> 2, word(s, 8) as *const u8),
            };
            if len > 22 && s[0] & 3 == 0 {
                return Err(Error::invalid("malformed string tensor"));
            }
            // SAFETY: TF guarantees `len` readable bytes at `data` while the tensor lives.
            out.push(unsafe { std::slice::from_raw_parts(data, len) }.to_vec());
        }
        Ok(out)
    }

    /// The single element of a scalar `string` tensor, as UTF-8.
    pub fn scalar_string(&self, what: &str) -> Result<String> {
        let mut v = self.strings()?;
        if v.len() != 1 || !self.shape().is_empty() {
            return Err(Error::invalid(format!(
                "{what} must be a scalar string, got shape {:?}",
                self.shape()
            )));
        }
        String::from_utf8(v.remove(0)).map_err(|_| Error::invalid(format!("{what} is not UTF-8")))
    }
}

impl Drop for Input {
    fn drop(&mut self) {
        // SAFETY: TF_GetInput passed ownership of this reference to us.
        unsafe { TF_DeleteTensor(self.0) }
    }
}

/// The context of one `compute` call.
pub struct Context(*mut TF_OpKernelContext);

impl Context {
    pub fn num_inputs(&self) -> usize {
        // SAFETY: live context.
        unsafe { TF_NumInputs(self.0) as usize }
    }

    pub fn input(&self, i: usize) -> Result<Input> {
        let mut t = ptr::null_mut();
        let status = Status::new();
        // SAFETY: live context; on success TF hands us a tensor reference to release.
        unsafe { TF_GetInput(self.0, i as c_int, &mut t, status.0) };
        status.check()?;
        Ok(Input(t))
    }

    /// Allocates output `i` with `dims` (`elem` bytes per element) and lets `fill` write it.
    pub fn output(
        &self,
        i: usize,
        dtype: i32,
        dims: &[i64],
        elem: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let len = dims.iter().product::<i64>().max(0) as usize * elem;
        let status = Status::new();
        // SAFETY: live context; dims has num_dims entries.
        let t = unsafe {
            TF_AllocateOutput(
                self.0,
                i as c_int,
                dtype,
                dims.as_ptr(),
                dims.len() as c_int,
                len,
                status.0,
            )
        };
        status.check()?;
        if t.is_null() {
            return Err(Error {
                code: code::INTERNAL,
                message: format!("TensorFlow did not allocate output {i}"),
            });
        }
        // TF sizes the buffer from the op's declared output type, not from `dtype`/`len`:
        // check they agree before writing.
        // SAFETY: t is a live tensor we own a reference to.
        let (size, actual) = unsafe { (TF_TensorByteSize(t), TF_TensorType(t)) };
        if size != len || actual != dtype {
            // SAFETY: we own this reference.
            unsafe { TF_DeleteTensor(t) };
            return Err(Error {
                code: code::INTERNAL,
                message: format!(
                    "output {i}: allocated {size} bytes of dtype {actual}, expected {len} of {dtype}"
                ),
            });
        }
        // SAFETY: the new output tensor holds `len` bytes (checked above) that nothing else
        // references until compute returns; we release our reference (the context keeps its
        // own) after `fill`.
        unsafe {
            let data = TF_TensorData(t) as *mut u8;
            let result = if len == 0 || data.is_null() {
                fill(&mut [])
            } else {
                fill(std::slice::from_raw_parts_mut(data, len))
            };
            TF_DeleteTensor(t);
            result
        }
    }

    /// Allocates output `i` and fills it with `values`.
    pub fn output_values<T: Copy>(
        &self,
        i: usize,
        dtype: i32,
        dims: &[i64],
        values: &[T],
    ) -> Result<()> {
        // SAFETY: the scalars used here (u64, f64, i64, i32, u8) are plain bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
        };
        self.output(i, dtype, dims, std::mem::size_of::<T>(), |out| {
            out.copy_from_slice(bytes);
            Ok(())
        })
    }
}

/// A kernel: built once per node (per iterator in `tf.data`), computed many times, possibly
/// concurrently.
pub trait Kernel: Send + Sync + Sized + 'static {
    fn create(c: &Construction) -> Result<Self>;
    fn compute(&self, ctx: &Context) -> Result<()>;
}

fn panic_error(p: Box<dyn std::any::Any + Send>) -> Error {
    let what = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    Error {
        code: code::INTERNAL,
        message: format!("reverb kernel panicked: {what}"),
    }
}

unsafe extern "C" fn create<K: Kernel>(c: *mut TF_OpKernelConstruction) -> *mut c_void {
    let construction = Construction(c);
    let result = catch_unwind(AssertUnwindSafe(|| K::create(&construction)))
        .unwrap_or_else(|p| Err(panic_error(p)));
    match result {
        Ok(k) => Box::into_raw(Box::new(k)) as *mut c_void,
        Err(e) => {
            let status = Status::from_error(&e);
            // SAFETY: c is the live construction TF passed in.
            unsafe { TF_OpKernelConstruction_Failure(c, status.0) };
            ptr::null_mut()
        }
    }
}

unsafe extern "C" fn compute<K: Kernel>(kernel: *mut c_void, ctx: *mut TF_OpKernelContext) {
    if kernel.is_null() {
        return;
    }
    // SAFETY: `kernel` came from Box::into_raw in create::<K> and is freed only in delete::<K>,
    // after every compute call has returned; K is Sync so shared access is fine.
    let k = unsafe { &*(kernel as *const K) };
    let context = Context(ctx);
    let result = catch_unwind(AssertUnwindSafe(|| k.compute(&context)))
        .unwrap_or_else(|p| Err(panic_error(p)));
    if let Err(e) = result {
        let status = Status::from_error(&e);
        // SAFETY: ctx is the live context TF passed in.
        unsafe { TF_OpKernelContext_Failure(ctx, status.0) };
    }
}

unsafe extern "C" fn delete<K: Kernel>(kernel: *mut c_void) {
    if !kernel.is_null() {
        // SAFETY: created by Box::into_raw in create::<K>; TF deletes each kernel once.
        let k = unsafe { Box::from_raw(kernel as *mut K) };
        // A panic while dropping must not unwind into TensorFlow.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(k)));
    }
}

/// Registers an op: input/output/attr specs in TF's `name: type` syntax; outputs come in
/// groups (concatenated in order). A `stateful` op has effects beyond its outputs (or
/// outputs that are not a function of its inputs): TensorFlow never folds, dedups or
/// reorders it.
pub fn register_op(
    name: &str,
    inputs: &[&str],
    outputs: &[&[&str]],
    attrs: &[&str],
    stateful: bool,
) -> Result<()> {
    let n = cstr(name);
    // SAFETY: the builder is created here and consumed by TF_RegisterOpDefinition; spec strings
    // are copied by TF.
    unsafe {
        let b = TF_NewOpDefinitionBuilder(n.as_ptr());
        for a in attrs {
            TF_OpDefinitionBuilderAddAttr(b, cstr(a).as_ptr());
        }
        for i in inputs {
            TF_OpDefinitionBuilderAddInput(b, cstr(i).as_ptr());
        }
        for o in outputs.iter().flat_map(|group| group.iter()) {
            TF_OpDefinitionBuilderAddOutput(b, cstr(o).as_ptr());
        }
        // TensorFlow marks the op stateful whatever the flag says: call it only for those.
        if stateful {
            TF_OpDefinitionBuilderSetIsStateful(b, true);
        }
        let status = Status::new();
        TF_RegisterOpDefinition(b, status.0);
        status.check()
    }
}

/// Registers `K` as the CPU kernel of op `name`.
pub fn register_kernel<K: Kernel>(name: &str) -> Result<()> {
    let n = cstr(name);
    let device = cstr("CPU");
    // SAFETY: the builder is consumed by TF_RegisterKernelBuilder; the callbacks are
    // monomorphized for K and live for the program.
    unsafe {
        let b = TF_NewKernelBuilder(
            n.as_ptr(),
            device.as_ptr(),
            Some(create::<K>),
            Some(compute::<K>),
            Some(delete::<K>),
        );
        let status = Status::new();
        TF_RegisterKernelBuilder(n.as_ptr(), b, status.0);
        status.check()
    }
}
