//! Harness Engine over the Model Context Protocol (`spec/003_bab976795353d872.txt`):
//! the same memory and run ledger as `/v1`, as 17 tools any MCP client can call.
//!
//! - [`catalog`]: the tools, their schemas and their canonical order (what `tools/list`
//!   answers, committed as `docs/mcp-tools.json`).

pub mod catalog;
