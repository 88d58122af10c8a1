#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_fuzz::ollama_stream(data));
