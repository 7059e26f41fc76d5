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

/// Builder methods that store their one argument in a field and return
/// the builder: `/// docs` then `name(arg: Type) => field;` for each. The
/// options types have a dozen of them, alike but for names.
macro_rules! setters {
    ($($(#[$attr:meta])* $name:ident($arg:ident: $ty:ty) => $field:ident;)+) => {$(
        $(#[$attr])*
        pub fn $name(mut self, $arg: $ty) -> Self {
            self.$field = $arg;
            self
        }
    )+};
}
