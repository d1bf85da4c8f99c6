"""The measurement protocols, one implementation each: `common` (configs, tools, runs, eviction validity), then
`ppl`, `niah`, `bench`, `demo` and `v3` on top. The bash scripts in scripts/ only call these or the tools."""
