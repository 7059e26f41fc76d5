pub mod model;
pub mod ops;
pub mod store_util;
