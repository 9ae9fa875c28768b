"""What one conversation about a document holds: its settings and how they are checked before the model
loads, the reading plan (full attention or the pot, `--budget auto`), the prompt format, the Session that
reads and answers, and the saved context (`--save-context` / `--context`).

Import from the modules (kvpot.session.session.Session, ...): this package re-exports nothing, so the
engine can use the saved-state codec (engine_state) without loading the Session that builds on the engine."""
