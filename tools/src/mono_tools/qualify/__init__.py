"""`mono qualify`: check a machine before it serves, the way nccl-tests checks a fabric."""
