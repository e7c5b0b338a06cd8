//! tapegrad facade
