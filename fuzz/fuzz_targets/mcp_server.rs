#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_fuzz::mcp_server(data));
