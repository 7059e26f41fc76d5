//! Small macros the crate's modules share.

/// `Display` as the type's `as_str()`, for the enums whose word is their
/// display.
macro_rules! display_as_str {
    ($($t:ty),+ $(,)?) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )+};
}
