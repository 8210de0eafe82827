#!/bin/bash
# fio nbd engine: 1 MiB seq write (qd16, 768 MiB, 2:1 data, end_fsync) then seq read, zbd lz4 vs none,
# binaries main and new, alternating rounds. Output: one JSON line per run.
set -u
work=$(mktemp -d /var/tmp/zbd-nbdab.XXXXXX)
trap 'rm -rf "$work"' EXIT
data=(--refill_buffers=1 --buffer_compress_percentage=50 --buffer_compress_chunk=4k)
for r in 1 2 3; do
  bins="/tmp/zbd-main-speed2 /tmp/zbd-new"; (( r % 2 == 0 )) && bins="/tmp/zbd-new /tmp/zbd-main-speed2"
  for b in $bins; do
    for codec in lz4 none; do
      rm -f $work/v.zbd $work/s.sock
      $b create $work/v.zbd --size 1G --codec $codec >/dev/null
      $b serve $work/v.zbd --socket $work/s.sock > $work/log 2>&1 & pid=$!
      for _ in $(seq 100); do [[ -S $work/s.sock ]] && break; sleep 0.1; done
      common=(--ioengine=nbd --uri="nbd+unix:///?socket=$work/s.sock" --bs=1M --iodepth=16 --size=768M)
      fio --output-format=json --output=$work/w.json --name=w --rw=write --end_fsync=1 "${common[@]}" "${data[@]}" >/dev/null
      w=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["write"]["bw"]/1024)' $work/w.json)
      fio --output-format=json --output=$work/r.json --name=r --rw=read "${common[@]}" >/dev/null
      rd=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"][0]["read"]["bw"]/1024)' $work/r.json)
      kill $pid; wait $pid 2>/dev/null
      echo "{\"round\": $r, \"bin\": \"$b\", \"codec\": \"$codec\", \"write_mib_s\": $w, \"read_mib_s\": $rd}"
    done
  done
done
