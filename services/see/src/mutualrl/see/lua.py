"""The Lua script that indexes one Publish batch; it runs inside the batch's MULTI/EXEC.

One Publish is one MULTI/EXEC transaction of two commands: one MSET that stages every record's
payload under `<run>stage:<nonce>:<i>`, then EVALSHA of this script. Redis runs the transaction
as one unit (nothing else runs in between, and a client that dies before EXEC leaves nothing
behind), so a record is never half stored, and the reply only comes back once every record is
in Redis.

Why the payloads are not script arguments: Redis converts every script argument to a Lua string
and every `redis.call` argument back, which costs ~20 µs per 5 kB record against ~5 µs for a
plain SET (measured with INFO commandstats). Why one MSET rather than a SET per record: a client
library spends far more per command (packing, one reply each) than per argument.

Per record the script issues HSETNX on the id index (idempotency): a new record's staged payload
is RENAMEd to its key `rec:<record id>` (a pointer move, no copy) with the run's TTL, a
duplicate's is deleted; a new record's header is XADDed with an id the script generates itself
(unique across the run's three streams, so one cursor pages all kinds); REWARD_STATS /
VERIFIED_SUCCESS records also land in their query index. Per batch it trims each touched
stream to max_stream_len once it exceeds it by `slack` entries (dropping the trimmed records'
payload keys and index entries, and counting exactly what it removed), drops the oldest rounds
beyond max_rounds, bumps the counters and refreshes every TTL.
"""

# KEYS: 1 lastid, 2 idx, 3 counts, 4 trimmed, 5 config, 6 rounds, 7..9 streams (kind 1..3),
#       10.. auxiliary keys (round-stats and success hashes)
# ARGV: 1 maxlen, 2 ttl, 3 max_rounds, 4 max_successes_per_prompt, 5 n, 6 round-stats key
#       prefix, 7 record key prefix, 8 trim slack, 9 the records: per record
#       rid, kind, policy, header (stream field h), aux joined by FIELD_SEP, records joined by
#       RECORD_SEP (one argument for the batch: a client packs each argument on its own, and
#       5 per record cost more than the script's split of one), 10 the staging key prefix
#       (record i's payload waits at <prefix><i>, i from 0)
#       aux: "" for ROLLOUT; "<key index>\x1f<field>\x1f<value>\x1f<round>" for REWARD_STATS;
#       "<key index>\x1f<field>" for VERIFIED_SUCCESS
FIELD_SEP = "\x1d"
RECORD_SEP = "\x1e"

PUBLISH_LUA = r"""
local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then out[#out + 1] = string.sub(s, start); return out end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
local NAMES = {'ROLLOUT', 'REWARD_STATS', 'VERIFIED_SUCCESS'}
local maxlen = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local max_rounds = tonumber(ARGV[3])
local max_succ = tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local rs_prefix = ARGV[6]
local rec_prefix = ARGV[7]
local slack = tonumber(ARGV[8])

local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lms, lseq = 0, -1
local last = redis.call('GET', KEYS[1])
if last then
  local a, b = string.match(last, '^(%d+)-(%d+)$')
  if a then lms, lseq = tonumber(a), tonumber(b) end
else
  -- lastid lost (never set, or flushed): start past every stream's last entry, so XADD can
  -- never fail half-way through the batch on an id that is too small.
  for k = 7, 9 do
    local e = redis.call('XREVRANGE', KEYS[k], '+', '-', 'COUNT', 1)
    if e[1] then
      local a, b = string.match(e[1][1], '^(%d+)-(%d+)$')
      a, b = tonumber(a), tonumber(b)
      if a > lms or (a == lms and b > lseq) then lms, lseq = a, b end
    end
  end
end
if now_ms > lms then lms, lseq = now_ms, -1 end

local out = {}
local added = {0, 0, 0}
local counts = {}
local dups = 0
local touched = {}
local rounds = {}
local stage = ARGV[10]
local dup_stages = {}
local i = -1
-- One pattern match per record, no table: half the cost of splitting the batch, then each row.
for rid, kind_s, policy, header, aux_s in string.gmatch(ARGV[9] .. '\30',
    '([^\29]*)\29([^\29]*)\29([^\29]*)\29([^\29]*)\29([^\30]*)\30') do
  i = i + 1
  local kind = tonumber(kind_s)
  local id = string.format('%d-%d', lms, lseq + 1)
  if redis.call('HSETNX', KEYS[2], rid, kind .. ':' .. id) == 0 then
    out[i + 1] = '0'
    dups = dups + 1
    dup_stages[#dup_stages + 1] = stage .. i
  else
    lseq = lseq + 1
    local rec_key = rec_prefix .. rid
    redis.call('RENAME', stage .. i, rec_key)
    redis.call('EXPIRE', rec_key, ttl)
    redis.call('XADD', KEYS[6 + kind], id, 'h', header)
    added[kind] = added[kind] + 1
    local cf = policy .. '|' .. kind
    counts[cf] = (counts[cf] or 0) + 1
    if kind ~= 1 then
      local aux = split(aux_s, '\31')
      local key = KEYS[tonumber(aux[1])]
      touched[key] = true
      if kind == 2 then
        redis.call('HSET', key, aux[2], aux[3])
        rounds[aux[4]] = true
      else
        -- A new distinct text only while the prompt has room; a known one is refreshed.
        if redis.call('HEXISTS', key, aux[2]) == 1 or redis.call('HLEN', key) < max_succ then
          redis.call('HSET', key, aux[2], rid)
        end
      end
    end
    out[i + 1] = '1'
  end
end

local trimmed = {0, 0, 0}
for k = 1, 3 do
  if added[k] > 0 then
    local len = redis.call('XLEN', KEYS[6 + k])
    if len > maxlen + slack then
      -- Trim in amortised steps (like MAXLEN ~), but know exactly which entries go: their
      -- records' payload keys and index entries go with them.
      local excess = len - maxlen
      local gone = redis.call('XRANGE', KEYS[6 + k], '-', '+', 'COUNT', excess)
      local rids, recs = {}, {}
      for j, e in ipairs(gone) do
        local h = e[2][2]
        local rid = string.sub(h, 1, (string.find(h, '\31', 1, true) or (#h + 1)) - 1)
        rids[#rids + 1] = rid
        recs[#recs + 1] = rec_prefix .. rid
        if #rids == 500 or j == #gone then
          redis.call('HDEL', KEYS[2], unpack(rids))
          redis.call('DEL', unpack(recs))
          rids, recs = {}, {}
        end
      end
      local last_gone = gone[#gone][1]
      local a, b = string.match(last_gone, '^(%d+)-(%d+)$')
      redis.call('XTRIM', KEYS[6 + k], 'MINID', string.format('%d-%d', tonumber(a),
                                                               tonumber(b) + 1))
      redis.call('HINCRBY', KEYS[4], NAMES[k], #gone)
      trimmed[k] = #gone
    end
  end
end

local dropped_rounds = 0
if next(rounds) then
  for r, _ in pairs(rounds) do redis.call('ZADD', KEYS[6], tonumber(r), r) end
  local card = redis.call('ZCARD', KEYS[6])
  if card > max_rounds then
    local old = redis.call('ZRANGE', KEYS[6], 0, card - max_rounds - 1)
    for _, r in ipairs(old) do
      -- Same hash tag as every other key of the run, so the same cluster slot.
      redis.call('DEL', rs_prefix .. r)
    end
    redis.call('ZREMRANGEBYRANK', KEYS[6], 0, card - max_rounds - 1)
    redis.call('HINCRBY', KEYS[4], 'round_stats', #old)
    dropped_rounds = #old
  end
end

for j = 1, #dup_stages, 500 do
  redis.call('DEL', unpack(dup_stages, j, math.min(j + 499, #dup_stages)))
end
for f, c in pairs(counts) do redis.call('HINCRBY', KEYS[3], f, c) end
if dups > 0 then redis.call('HINCRBY', KEYS[3], '!dup', dups) end
if lseq >= 0 then redis.call('SET', KEYS[1], string.format('%d-%d', lms, lseq)) end
for k = 1, 9 do redis.call('EXPIRE', KEYS[k], ttl) end
for key, _ in pairs(touched) do redis.call('EXPIRE', key, ttl) end
return {table.concat(out), trimmed[1], trimmed[2], trimmed[3], dropped_rounds}
"""
