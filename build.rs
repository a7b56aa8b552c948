//! Rebuild when a migration changes: `sqlx::migrate!` embeds `migrations/`.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
