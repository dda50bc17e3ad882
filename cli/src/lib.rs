//! The `floodgate` command's subcommands as a library, so that tests and
//! fuzz targets can run them in-process. The binary is `src/main.rs`.

pub mod args;
pub mod replay;
#[cfg(feature = "rls")]
pub mod rls;
#[cfg(any(feature = "proxy", feature = "rls"))]
pub mod scrapes;
#[cfg(any(feature = "proxy", feature = "rls"))]
pub mod signals;
#[cfg(any(feature = "proxy", feature = "rls"))]
pub mod stores;
