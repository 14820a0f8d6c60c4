//! Compiles proto/pko/agent/v1/agent.proto with protox (a Rust protobuf compiler: no system protoc).
fn main() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let file = root.join("pko/agent/v1/agent.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    let fds = protox::compile([&file], [&root]).expect("agent.proto compiles");
    tonic_prost_build::configure().compile_fds(fds).expect("code generation");
}
