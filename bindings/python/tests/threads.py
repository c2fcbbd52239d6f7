"""Concurrent callers for the exactness tests."""

import threading


def admitted_from_threads(decide, threads: int = 8, each: int = 40) -> int:
    """How many of `threads` × `each` calls of `decide()` (true when admitted) were admitted."""
    admitted = []

    def worker():
        admitted.append(sum(bool(decide()) for _ in range(each)))

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(admitted)
