# dicts: python3 building and serializing a large dict of lists and
# strings, for the sALLOC tests (against heaptrack) and the bench.
import json

d = {}
for i in range(400000):
    d[str(i)] = [i, str(i) * 40, {'k': 'v' * (i % 700)}]
s = json.dumps(d)
print(len(s), len(json.loads(s)))
