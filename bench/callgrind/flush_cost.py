"""Drives the flusher's Redis side with a fixed workload, for flush_cost.sh.

    python3 flush_cost.py setup|run PORT ACK_SCRIPT [READ_SCRIPT]

`setup` fills one bucket stream with 20,000 order records and its consumer
group; `run` reads them in batches of 200 and acknowledges each batch with
ACK_SCRIPT (stream_ack.lua of the build under test). With READ_SCRIPT
(stream_read.lua before issue 12) the reads go through it; without, they are
plain XREADGROUP, as the flusher sends them now. PER=n in the environment
writes the records n to an entry, as purchase.lua writes the orders of one
call (field order id, value its index entry); reads then ask for 200 / n
entries, so a batch is still 200 records.
"""
import os
import sys

import redis

mode, port, ack = sys.argv[1], int(sys.argv[2]), sys.argv[3]
read = sys.argv[4] if len(sys.argv) > 4 else None
r = redis.Redis(port=port)
key, group, records = "ss:{ev#0#0}:orders", "flusher", 20000
per = int(os.environ.get("PER", "1"))
batch = 200 // per
if mode == "setup":
    p = r.pipeline(transaction=False)
    for i in range(0, records, per):
        if per == 1:
            p.xadd(key, {"d": f"o|ev.{i:016x}.{i:016x}|u-{i}|1|0|0|u-{i}/r{i}|1700000000000"})
        else:
            p.execute_command("XADD", key, "*", *[
                x for j in range(i, i + per)
                for x in (f"ev.{j:016x}.{j:016x}", f"C|u-{j}|1|0|u-{j}/r{j}|1700000000000")
            ])
        if i % 500 == 0:
            p.execute()
    p.execute()
    r.xgroup_create(key, group, id="0")
    sys.exit(0)
ack_script = r.register_script(open(ack).read())
read_script = r.register_script(open(read).read()) if read else None
done = 0
while True:
    if read_script:
        entries = read_script(keys=[key], args=[group, "c", batch, ""])
    else:
        got = r.xreadgroup(group, "c", {key: ">"}, count=batch)
        entries = got[0][1] if got else []
    if not entries:
        break
    ack_script(keys=[key], args=[group] + [e[0] for e in entries])
    done += len(entries) * per
assert done == records and r.xlen(key) == 0, (done, r.xlen(key))
