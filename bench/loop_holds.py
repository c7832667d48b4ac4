#!/usr/bin/env python3
"""What kept fleetd's event loop busy, second by second, from a py-spy recording.

Record fleetd with idle samples kept, so that the samples of its main thread are its timeline (one
per 1/rate s, busy or waiting in the gevent hub):

    py-spy record -p PID -d 110 -r 100 --idle -f speedscope -o loop.json
    .venv/bin/python bench/loop_holds.py loop.json [--rate 100] [--top 8]

Prints, for each second of the event loop's thread, how busy it was and the fleetd frames most
seen, then the longest busy stretches. A stretch is busy whenever the loop is not waiting for
events: one request that holds it, many requests back to back, or Python code waiting for the
interpreter lock that a worker thread holds (each SQLite call and socket write gives the lock
away). The worker threads' busiest fleetd frames over the whole recording are printed last: a
worker busy in Python code while the loop's stretches grow is the lock's holder.
"""

import argparse
import collections
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", help="a py-spy speedscope file recorded with --idle")
    parser.add_argument("--rate", type=int, default=100, help="py-spy's samples per second")
    parser.add_argument("--top", type=int, default=8, help="frames shown per line and stretch")
    args = parser.parse_args()
    with open(args.recording) as f:
        recording = json.load(f)
    frames = recording["shared"]["frames"]

    def name(i):
        frame = frames[i]
        where = frame.get("file", "").split("site-packages/")[-1].split("/fleetd/", 1)[-1]
        return f"{frame['name']} ({where})"

    def waiting(stack):
        top = frames[stack[-1]] if stack else None
        return top is None or (
            top["name"].endswith("run") and "gevent/hub.py" in top.get("file", "")
        )

    loops = [
        p
        for p in recording["profiles"]
        if any(s and "gevent/hub.py" in frames[s[0]].get("file", "") for s in p["samples"])
    ]
    if not loops:
        raise SystemExit("no thread of this recording runs a gevent hub")
    loop = max(loops, key=lambda p: len(p["samples"]))
    samples = loop["samples"]

    def fleetd_frames(stacks):
        """The fleetd frames most seen in these stacks (the server's own, in every request, left
        out)."""
        seen = collections.Counter()
        for stack in stacks:
            for frame in {
                name(i)
                for i in stack
                if "fleetd/" in frames[i].get("file", "")
                and not frames[i].get("file", "").endswith("fleetd/server.py")
            }:
                seen[frame] += 1
        return ", ".join(f"{frame} {n}" for frame, n in seen.most_common(args.top))

    print(f"thread {loop['name']}: {len(samples)} samples, {len(samples) / args.rate:.1f} s")
    for second in range(0, len(samples), args.rate):
        chunk = [s for s in samples[second : second + args.rate] if not waiting(s)]
        print(
            f"{second // args.rate:5d} s  busy {100 * len(chunk) / args.rate:3.0f} %  "
            + fleetd_frames(chunk)
        )
    stretches, current, start = [], [], 0
    for at, stack in enumerate(samples):
        if waiting(stack):
            if current:
                stretches.append((len(current), start, current))
            current = []
        else:
            if not current:
                start = at
            current.append(stack)
    if current:
        stretches.append((len(current), start, current))
    stretches.sort(key=lambda s: s[0], reverse=True)
    print("\nlongest busy stretches:")
    for length, start, stacks in stretches[: args.top]:
        print(
            f"  {1000 * length / args.rate:8.0f} ms from {start / args.rate:.1f} s: "
            + fleetd_frames(stacks)
        )
    for worker in recording["profiles"]:
        if worker is not loop:
            busy = [s for s in worker["samples"] if any("fleetd/" in frames[i]["file"] for i in s)]
            print(f"\nthread {worker['name']}: busy in fleetd code {len(busy)} samples")
            print("  " + fleetd_frames(busy))


if __name__ == "__main__":
    main()
