"""The engine's saved state, below the engine that owns it: the engine's state as plain data and its checks
(engine_state), the file it is written in (state_container), the cells a recall keeps apart until the next
compaction (recall_cells), and where a stopped read goes on (read_point). A saved context's header, which
also names the settings and sources a session read with, is kvpot.session.context_file's.

Import from the modules (kvpot.state.engine_state.EngineState, ...): this package re-exports nothing."""
