"""Pure parts both sides import: the event schema, errors, the checkpoint catalog and
manifest. Nothing here imports torch or the notebook's widget libraries."""
