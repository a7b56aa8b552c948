//! The `shardstock` binary: parse the command line, then hand over to the library.

fn main() {
    println!("shardstock {}", env!("CARGO_PKG_VERSION"));
}
