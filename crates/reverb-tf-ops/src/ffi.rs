//! Declarations of the TensorFlow C API functions this library uses (`tensorflow/c/kernels.h`,
//! `ops.h`, `tf_tensor.h`, `tf_status.h`). Only functions listed in
//! `tf_symbols.txt` may appear here: that list is what every supported TensorFlow exports.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

macro_rules! opaque {
    ($($name:ident),*) => {$(
        /// Opaque TensorFlow type, only handled through pointers.
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    TF_Status,
    TF_Tensor,
    TF_OpKernelConstruction,
    TF_OpKernelContext,
    TF_KernelBuilder,
    TF_OpDefinitionBuilder
);

/// `TF_DataType` (a C enum): the values of `tensorflow.DataType`.
pub type TF_DataType = c_int;
/// `TF_Code` (a C enum): the canonical status codes, the same numbers as gRPC's.
pub type TF_Code = c_int;

pub type CreateFn = unsafe extern "C" fn(*mut TF_OpKernelConstruction) -> *mut c_void;
pub type ComputeFn = unsafe extern "C" fn(*mut c_void, *mut TF_OpKernelContext);
pub type DeleteFn = unsafe extern "C" fn(*mut c_void);

extern "C" {
    pub fn TF_NewStatus() -> *mut TF_Status;
    pub fn TF_DeleteStatus(s: *mut TF_Status);
    pub fn TF_SetStatus(s: *mut TF_Status, code: TF_Code, msg: *const c_char);
    pub fn TF_GetCode(s: *const TF_Status) -> TF_Code;
    pub fn TF_Message(s: *const TF_Status) -> *const c_char;

    pub fn TF_TensorData(t: *const TF_Tensor) -> *mut c_void;
    pub fn TF_NumDims(t: *const TF_Tensor) -> c_int;
    pub fn TF_Dim(t: *const TF_Tensor, index: c_int) -> i64;
    pub fn TF_TensorByteSize(t: *const TF_Tensor) -> usize;
    pub fn TF_TensorType(t: *const TF_Tensor) -> TF_DataType;
    pub fn TF_DeleteTensor(t: *mut TF_Tensor);

    pub fn TF_NewOpDefinitionBuilder(op_name: *const c_char) -> *mut TF_OpDefinitionBuilder;
    pub fn TF_OpDefinitionBuilderAddAttr(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderAddInput(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderAddOutput(b: *mut TF_OpDefinitionBuilder, spec: *const c_char);
    pub fn TF_OpDefinitionBuilderSetIsStateful(b: *mut TF_OpDefinitionBuilder, stateful: bool);
    pub fn TF_RegisterOpDefinition(b: *mut TF_OpDefinitionBuilder, status: *mut TF_Status);

    pub fn TF_NewKernelBuilder(
        op_name: *const c_char,
        device_name: *const c_char,
        create: Option<CreateFn>,
        compute: Option<ComputeFn>,
        delete: Option<DeleteFn>,
    ) -> *mut TF_KernelBuilder;
    pub fn TF_RegisterKernelBuilder(
        kernel_name: *const c_char,
        builder: *mut TF_KernelBuilder,
        status: *mut TF_Status,
    );

    pub fn TF_NumInputs(ctx: *mut TF_OpKernelContext) -> c_int;
    pub fn TF_GetInput(
        ctx: *mut TF_OpKernelContext,
        i: c_int,
        tensor: *mut *mut TF_Tensor,
        status: *mut TF_Status,
    );
    pub fn TF_AllocateOutput(
        ctx: *mut TF_OpKernelContext,
        index: c_int,
        dtype: TF_DataType,
        dims: *const i64,
        num_dims: c_int,
        len: usize,
        status: *mut TF_Status,
    ) -> *mut TF_Tensor;
    pub fn TF_OpKernelContext_Failure(ctx: *mut TF_OpKernelContext, status: *mut TF_Status);

    pub fn TF_OpKernelConstruction_Failure(
        ctx: *mut TF_OpKernelConstruction,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrSize(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        list_size: *mut i32,
        total_size: *mut i32,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrString(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut c_char,
        max_length: usize,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrInt64(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut i64,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrBool(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        val: *mut u8,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrTypeList(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        vals: *mut TF_DataType,
        max_vals: c_int,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrInt64List(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        vals: *mut i64,
        max_vals: c_int,
        status: *mut TF_Status,
    );
    pub fn TF_OpKernelConstruction_GetAttrStringList(
        ctx: *mut TF_OpKernelConstruction,
        name: *const c_char,
        values: *mut *mut c_char,
        lengths: *mut usize,
        max_values: c_int,
        storage: *mut c_void,
        storage_size: usize,
        status: *mut TF_Status,
    );
}
