//! Small helpers shared by the modules.

use std::ffi::CString;
use std::path::Path;

use crate::{Error, Result};

/// A NUL-terminated copy of `s`; an error naming `what` when `s` contains a NUL byte.
pub(crate) fn cstring(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what}: the string contains a NUL byte")))
}

/// A NUL-terminated copy of a path.
pub(crate) fn cpath(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = path
        .to_str()
        .ok_or_else(|| Error::invalid(format!("path {}: not valid Unicode", path.display())))?
        .as_bytes()
        .to_vec();
    CString::new(bytes)
        .map_err(|_| Error::invalid(format!("path {}: contains a NUL byte", path.display())))
}

/// The text of a NUL-terminated byte buffer filled by the library (up to the first NUL).
pub(crate) fn text_of(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
