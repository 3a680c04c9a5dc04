//! Keeps the floors: the build fails, naming the file, the line, the import and the
//! floors, when a module of the library imports one on its own floor or above, or when
//! files import each other in a circle (build/layering.rs reads the source; its FLOORS
//! table says each top-level module's floor). Only the standard library, and it reruns
//! only when something under `src/` changed.

#[path = "build/layering.rs"]
mod layering;

fn main() {
    println!("cargo::rerun-if-changed=src");
    let root = std::path::PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    match layering::check(&root) {
        Ok(found) => {
            for violation in found {
                println!("cargo::error={violation}");
            }
        }
        Err(e) => println!("cargo::error=the layering of src/ could not be read: {e}"),
    }
}
