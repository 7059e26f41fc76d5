pub mod golden_dir;
pub mod model;
pub mod ops;
pub mod snapshot_bytes;
pub mod store_util;
