//! Prometheus metrics (issue 6).
