//! Keeps the floors: the build fails, naming the file, the line, the import and the
//! floors, when a module of the library imports one on its own floor or above, or when
//! files import each other in a circle (build/layering.rs reads the source; its FLOORS
//! table says each top-level module's floor). Only the standard library, and it reruns
//! only when something under `src/` (or the workspace's Cargo.lock) changed.
//!
//! It also names the build, `TOLLGATE_BUILD`: a hash of the source and Cargo.lock, so
//! that `tollgate run` hands over only to a `tollgate-proxy` of the same build (see
//! src/run.rs; `cargo run` rebuilds only the binary it runs). Both binaries serve `run`
//! from this crate alone, so its source and the lock file name the build.

#[path = "build/layering.rs"]
mod layering;

fn main() {
    println!("cargo::rerun-if-changed=src");
    println!("cargo::rerun-if-changed=../../Cargo.lock");
    let root = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!(
        "cargo::rustc-env=TOLLGATE_BUILD={:016x}",
        source_hash(&root)
    );
    match layering::check(&root) {
        Ok(found) => {
            for violation in found {
                println!("cargo::error={violation}");
            }
        }
        Err(e) => println!("cargo::error=the layering of src/ could not be read: {e}"),
    }
}

/// A hash of every file under `src/` (names and contents, in order) and of the
/// workspace's Cargo.lock.
fn source_hash(root: &std::path::Path) -> u64 {
    use std::hash::{Hash, Hasher};
    fn walk(root: &std::path::Path, dir: &std::path::Path, hasher: &mut std::hash::DefaultHasher) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
        paths.sort();
        for path in paths {
            if path.is_dir() {
                walk(root, &path, hasher);
            } else if let Ok(bytes) = std::fs::read(&path) {
                path.strip_prefix(root).unwrap_or(&path).hash(hasher);
                bytes.hash(hasher);
            }
        }
    }
    let mut hasher = std::hash::DefaultHasher::new();
    walk(root, &root.join("src"), &mut hasher);
    if let Ok(lock) = std::fs::read(root.join("../../Cargo.lock")) {
        lock.hash(&mut hasher);
    }
    hasher.finish()
}
