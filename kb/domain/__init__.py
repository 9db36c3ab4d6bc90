"""Pure knowledge-base rules and records: no SQL, no file or network I/O."""
