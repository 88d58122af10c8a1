#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_fuzz::git_config(data));
