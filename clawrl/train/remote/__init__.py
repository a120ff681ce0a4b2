"""A trainer on another host than the store: it claims, reports and publishes through the gateway's API.

`clawrl train --server URL --run-dir DIR` trains with `RemoteStore` (client.py) in place of the
store: the same methods the trainer loop, the canary gate and the wiring call (`Store`'s subset in
`wire.CALLS`), each one HTTP request to the gateway's admin-key routes (`clawrl/api/trainer.py`).
The gateway alone opens `clawrl.db`; its `TrainerDesk` (desk.py) runs each call on the store's
thread, holds the remote trainer's lease (lease.py) and, when the lease runs out, hands the
trainer's claimed samples back to the queue. A version travels as one tar stream with its
sha256 (folders.py): uploaded, the gateway checks the sum before it writes the folder into its own
run folder and publishes the row; downloaded, the trainer checks it before it loads the version.

    client.py   RemoteStore: the store's subset over HTTP, the heartbeat, reconnection
    desk.py     TrainerDesk: the gateway's side (a service of `clawrl serve` with train.enabled false)
    lease.py    Lease: which remote trainer holds the gateway's samples, and until when (pure)
    wire.py     the calls allowed and their JSON (pure)
    folders.py  a version folder packed into a tar with its sha256, and unpacked, checked
    errors.py   the exceptions both sides raise
"""
