//! Raw FFI declarations of libdstransformer's C API.
//!
//! `bindings.rs` is generated from `capi/include/dstransformer/dstransformer.h` by the bindgen CLI and
//! checked in, so building this crate needs neither bindgen nor libclang. Regenerate it with the CMake
//! target `rust_bindings`; the ctest entry `rust_bindings_fresh` fails when it is stale.
//!
//! Enumerations are bindgen "newtype" structs (`dst_status(pub c_uint)` with associated constants):
//! a value the library adds later is representable and never undefined behaviour.
//!
//! Everything here is `unsafe` and follows the C API's rules; the `dstransformer` crate is the safe
//! interface.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]
#![allow(clippy::all)]

include!("bindings.rs");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_reports_the_header_version() {
        // SAFETY: dst_version takes no arguments and has no preconditions.
        let v = unsafe { dst_version() };
        assert_eq!(v as u32, DST_VERSION_NUMBER);
    }

    #[test]
    fn config_struct_size_matches_the_header() {
        let mut cfg = std::mem::MaybeUninit::<dst_layer_config>::zeroed();
        // SAFETY: the pointer is valid for one dst_layer_config.
        let st = unsafe { dst_layer_config_default(cfg.as_mut_ptr()) };
        assert_eq!(st, dst_status::DST_OK);
        // SAFETY: dst_layer_config_default filled it.
        let cfg = unsafe { cfg.assume_init() };
        assert_eq!(cfg.struct_size, std::mem::size_of::<dst_layer_config>());
    }
}
