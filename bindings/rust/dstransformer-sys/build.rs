//! Finds libdstransformer for the linker.
//!
//! The library directory is, in order: the `DST_LIB_DIR` environment variable (ctest sets it to the
//! build tree), else the `-L` directories that `pkg-config --libs-only-L dstransformer` prints, else
//! none (the linker's default directories, e.g. an installation in /usr/lib). Every directory found
//! is also given to dependents as `DEP_DSTRANSFORMER_LIB_DIR` so that they can add a run path.
//! Only the standard library is used.

use std::env;
use std::process::Command;

fn pkg_config_dirs() -> Vec<String> {
    let output = match Command::new("pkg-config")
        .args(["--libs-only-L", "dstransformer"])
        .output()
    {
        Ok(out) if out.status.success() => out,
        _ => return Vec::new(),
    };
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .filter_map(|flag| flag.strip_prefix("-L"))
        .filter(|dir| !dir.is_empty())
        .map(str::to_owned)
        .collect()
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DST_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let dirs = match env::var("DST_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => vec![dir],
        _ => pkg_config_dirs(),
    };
    for dir in &dirs {
        println!("cargo:rustc-link-search=native={dir}");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
    if !dirs.is_empty() {
        // Metadata for dependents (cargo exposes it to them as DEP_DSTRANSFORMER_LIB_DIR).
        println!("cargo:lib_dir={}", dirs.join(":"));
    }
    println!("cargo:rustc-link-lib=dylib=dstransformer");
}
