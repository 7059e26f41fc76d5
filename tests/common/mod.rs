pub mod model;
pub mod ops;
