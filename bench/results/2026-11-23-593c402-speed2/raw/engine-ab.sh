#!/bin/bash
# alternating A/B of zbd bench engine: main vs new
for i in 1 2 3 4 5; do
  if (( i % 2 )); then order="/tmp/zbd-main-speed2 /tmp/zbd-new"; else order="/tmp/zbd-new /tmp/zbd-main-speed2"; fi
  for b in $order; do
    echo "$b $($b bench engine --codec lz4 --threads 1,2 --no-wa --size 256M --dir /var/tmp --json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"raw": d["raw_compress_mb_s"], "runs": [(r["threads"], r["write_mb_s"], r["read_mb_s"]) for r in d["runs"]]}))')"
  done
done
