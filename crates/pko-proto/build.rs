//! Compiles proto/pko/agent/v1/agent.proto with protox (a Rust protobuf compiler: no system protoc).
fn main() {
    // read when the script runs, not baked in when it is compiled: a build script binary may be shared
    // by checkouts of the workspace in other directories that use one target directory
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = std::path::Path::new(&manifest).join("../../proto");
    let file = root.join("pko/agent/v1/agent.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root]).expect("agent.proto compiles");
    tonic_prost_build::configure().compile_fds(fds).expect("code generation");
}
