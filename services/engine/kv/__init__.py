"""KV page and snapshot-row bookkeeping: logical ids handed out under completion fences."""
