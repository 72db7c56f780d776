//! Blocking client library (issue 5).
