//! Gives this crate's binaries (tests, examples) a run path to libdstransformer, found by the
//! `dstransformer-sys` build script; link arguments of a dependency do not reach them.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_DSTRANSFORMER_LIB_DIR");
    if let Ok(dirs) = std::env::var("DEP_DSTRANSFORMER_LIB_DIR") {
        for dir in dirs.split(':').filter(|d| !d.is_empty()) {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
