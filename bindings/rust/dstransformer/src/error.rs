//! Status codes and the error type.

use std::ffi::CStr;
use std::fmt;

use dstransformer_sys as sys;

/// Result of a call of the C API, as `dst_status` defines it (the numeric values are fixed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// `DST_OK`: success. An [`Error`] never carries it.
    Ok,
    /// `DST_ERR_INVALID_ARGUMENT`: an argument is out of range or of the wrong dtype or shape.
    InvalidArgument,
    /// `DST_ERR_UNSUPPORTED`: a valid request that this build or backend cannot serve.
    Unsupported,
    /// `DST_ERR_CAPACITY`: B·S or S exceeds the maxima the layer was created with.
    Capacity,
    /// `DST_ERR_OUT_OF_MEMORY`: an allocation failed (host or device).
    OutOfMemory,
    /// `DST_ERR_STATE`: a call out of order, e.g. backward without a training forward.
    State,
    /// `DST_ERR_BACKEND`: a backend library (BLAS, CUDA, cuBLAS) reported an error.
    Backend,
    /// `DST_ERR_IO`: a file could not be read or written.
    Io,
    /// `DST_ERR_FORMAT`: a file or buffer is malformed or does not match the target.
    Format,
    /// `DST_ERR_INTERNAL`: a bug in the library.
    Internal,
    /// A code this version of the crate does not know (from a newer library).
    Unknown(u32),
}

impl Status {
    /// The status of a raw `dst_status`.
    pub fn from_raw(raw: sys::dst_status) -> Status {
        match raw {
            sys::dst_status::DST_OK => Status::Ok,
            sys::dst_status::DST_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::dst_status::DST_ERR_UNSUPPORTED => Status::Unsupported,
            sys::dst_status::DST_ERR_CAPACITY => Status::Capacity,
            sys::dst_status::DST_ERR_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::dst_status::DST_ERR_STATE => Status::State,
            sys::dst_status::DST_ERR_BACKEND => Status::Backend,
            sys::dst_status::DST_ERR_IO => Status::Io,
            sys::dst_status::DST_ERR_FORMAT => Status::Format,
            sys::dst_status::DST_ERR_INTERNAL => Status::Internal,
            other => Status::Unknown(other.0),
        }
    }

    /// The numeric code (`DST_OK` is 0).
    pub fn code(self) -> u32 {
        match self {
            Status::Ok => 0,
            Status::InvalidArgument => 1,
            Status::Unsupported => 2,
            Status::Capacity => 3,
            Status::OutOfMemory => 4,
            Status::State => 5,
            Status::Backend => 6,
            Status::Io => 7,
            Status::Format => 8,
            Status::Internal => 99,
            Status::Unknown(code) => code,
        }
    }

    /// The library's name of the status, e.g. `"DST_ERR_CAPACITY"` (`dst_status_string`).
    pub fn name(self) -> &'static str {
        // SAFETY: dst_status_string accepts any value and returns a static NUL-terminated string.
        let ptr = unsafe { sys::dst_status_string(sys::dst_status(self.code())) };
        if ptr.is_null() {
            return "DST_ERR_UNKNOWN";
        }
        // SAFETY: non-null, NUL-terminated and static (owned by the library).
        unsafe { CStr::from_ptr(ptr) }
            .to_str()
            .unwrap_or("DST_ERR_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed call: its status and the library's message, which names the function, the argument and
/// what was expected.
///
/// Errors detected by this crate before calling the library (a slice of the wrong length, a string
/// with a NUL byte) carry [`Status::InvalidArgument`] and a message of the same form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// What kind of failure it is.
    pub status: Status,
    /// The library's message (`dst_last_error`), or this crate's.
    pub message: String,
}

impl Error {
    /// An error of this crate's own argument checks.
    pub(crate) fn invalid(message: String) -> Error {
        Error {
            status: Status::InvalidArgument,
            message,
        }
    }

    /// The status of the failure.
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message of the failure.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl std::error::Error for Error {}

/// Result of a fallible call.
pub type Result<T> = std::result::Result<T, Error>;

/// Turns a status into a result, reading `dst_last_error` (thread-local, so it must be called on the
/// thread that made the call, right after it: every caller does so).
pub(crate) fn check(raw: sys::dst_status) -> Result<()> {
    if raw == sys::dst_status::DST_OK {
        return Ok(());
    }
    // SAFETY: dst_last_error returns a thread-local NUL-terminated string, valid until the next
    // failing call on this thread; it is copied at once.
    let message = unsafe {
        let ptr = sys::dst_last_error();
        if ptr.is_null() {
            String::new()
        } else {
            CStr::from_ptr(ptr).to_string_lossy().into_owned()
        }
    };
    Err(Error {
        status: Status::from_raw(raw),
        message,
    })
}
