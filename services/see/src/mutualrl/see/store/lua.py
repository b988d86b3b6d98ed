"""The Lua script that indexes one Publish batch; it runs inside the batch's MULTI/EXEC.

One Publish is one MULTI/EXEC transaction: for each record kind in the batch, a SET of those
records' payloads, one after another, as one string `<run>b:<nonce><kind number>` (with the
run's TTL); then EVALSHA of the publish script. Redis runs the transaction as one unit (nothing
else runs in between, and a client that dies before EXEC leaves nothing behind), so a record is
never half stored, and the reply only comes back once every record is in Redis.

Why strings of many records: per record, a key of its own cost Redis a key of an MSET, a RENAME
to its final name and an EXPIRE, 4-5 µs of the ~13 µs Redis spent on a 6.45 kB record (INFO
commandstats under `mutualrl bench see`). A record is now a range of a string, found through
the id index. Why one string per kind: each kind has its own stream, trimmed on its own by
retention, so a string holds records that go at the same time (a batch's ROLLOUTs do not wait
in memory for its REWARD_STATS). Why the payloads are not script arguments: Redis converts every
script argument to a Lua string and every `redis.call` argument back, which costs ~20 µs per
5 kB record against ~5 µs for a plain SET.

Per record the publish script issues HSETNX on the id index (idempotency: the first record of an
id wins; a duplicate's bytes stay unreferenced in their string); a new record's header is XADDed
with an id the script generates itself (unique across the run's three streams, so one cursor
pages all kinds); REWARD_STATS / VERIFIED_SUCCESS records also land in their query index. The
`blobs` hash counts each string's live records: retention's trim takes a string's count down
with its records and deletes the string at zero, and a string of nothing but duplicates is
deleted at once. Per batch the script trims each touched stream to max_stream_len once it
exceeds it by `slack` entries (dropping the trimmed records' index entries and payloads, and
counting exactly what it removed), drops the oldest rounds beyond max_rounds, bumps the
counters and refreshes every TTL.

Index entries (`idx`): `layout.IndexEntry` (the string id is the nonce then the kind number).
Entries of the layout before batch strings read "<kind>:<stream id>", with the payload under
`<run>rec:<record id>`: the script trims those and the readers (`part.StorePart.payloads`) read
them, so a run carries on across the upgrade. Readers do not go
through a script: Redis would copy each payload into Lua and back, about 12 µs a 6.45 kB record
against 1 µs for GETRANGE.
"""

from mutualrl.see.store.layout import (
    ARGV_LUA,
    FIELD_SEP,
    HEADER_SEP,
    RECORD_SEP,
    SUCCESS_ROUNDS_PER_TEXT,
)

# KEYS and ARGV: `layout.KEYS`, `layout.ARGV` (the prologue below names every ARGV slot). The
# records travel as one argument (`layout.batch_rows`: a client packs each argument on its own,
# and 6 per record cost more than the script's split of one); the payloads of the batch's
# records of kind k are the string <prefix><nonce><k>, in record order.
_PROLOGUE = f"""
{ARGV_LUA}
local FS, RS, HS = '\\{ord(FIELD_SEP)}', '\\{ord(RECORD_SEP)}', '\\{ord(HEADER_SEP)}'
local ROW = '([^' .. FS .. ']*)' .. FS .. '([^' .. FS .. ']*)' .. FS .. '([^' .. FS .. ']*)' ..
  FS .. '([^' .. FS .. ']*)' .. FS .. '([^' .. FS .. ']*)' .. FS .. '([^' .. RS .. ']*)' .. RS
"""

PUBLISH_LUA = _PROLOGUE + r"""
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
local PER_TEXT = """ + str(SUCCESS_ROUNDS_PER_TEXT) + r"""

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
-- Counted as all live until the loop is done: were the script to fail half-way (it is not
-- rolled back), a string would outlive its indexed records rather than go before them.
for k in string.gmatch(present, '%d') do redis.call('HSET', KEYS[10], nonce .. k, n) end
local offsets = {0, 0, 0}
local i = -1
-- One pattern match per record, no table: half the cost of splitting the batch, then each row.
for rid, kind_s, size, policy, header, aux_s in string.gmatch(rows .. RS, ROW) do
  i = i + 1
  local kind = tonumber(kind_s)
  local id = string.format('%d-%d', lms, lseq + 1)
  if redis.call('HSETNX', KEYS[2], rid, kind_s .. ':' .. id .. ':' .. nonce .. kind_s .. ':'
                .. offsets[kind] .. ':' .. size) == 0 then
    out[i + 1] = '0'
    dups = dups + 1
  else
    lseq = lseq + 1
    redis.call('XADD', KEYS[6 + kind], id, 'h', header)
    added[kind] = added[kind] + 1
    local cf = policy .. '|' .. kind
    counts[cf] = (counts[cf] or 0) + 1
    if kind ~= 1 then
      local aux = split(aux_s, HS)
      local key = KEYS[tonumber(aux[1])]
      touched[key] = true
      if kind == 2 then
        redis.call('HSET', key, aux[2], aux[3])
        rounds[aux[4]] = true
      else
        -- A new distinct text only while the prompt has room. A text keeps the first record
        -- of each round that gave it ("|<round>:<record id>" entries, the last PER_TEXT): a
        -- read from round q finds its earliest record from q on, whatever later rounds gave
        -- the same text. A value of the layout before is one bare record id.
        local cur = redis.call('HGET', key, aux[2])
        if cur or redis.call('HLEN', key) < max_succ then
          local rnd = split(header, HS)[4]
          if not cur then
            redis.call('HSET', key, aux[2], '|' .. rnd .. ':' .. rid)
          else
            if string.sub(cur, 1, 1) ~= '|' then cur = '|?:' .. cur end
            if string.match(cur, '|([^|:]*):[^|]*$') ~= rnd then
              cur = cur .. '|' .. rnd .. ':' .. rid
              local _, n = string.gsub(cur, '|', '')
              if n > PER_TEXT then
                local second = string.find(cur, '|', 2, true)
                cur = string.sub(cur, second)
              end
              redis.call('HSET', key, aux[2], cur)
            end
          end
        end
      end
    end
    out[i + 1] = '1'
  end
  offsets[kind] = offsets[kind] + tonumber(size)
end
for k in string.gmatch(present, '%d') do
  local live = added[tonumber(k)]
  if live == 0 then
    redis.call('HDEL', KEYS[10], nonce .. k)
    redis.call('DEL', blob_prefix .. nonce .. k)
  elseif live < n then
    redis.call('HSET', KEYS[10], nonce .. k, live)
  end
end

-- Index entries and payloads of trimmed records: a batch string goes once its count of live
-- records reaches 0; an old layout's record key goes at once.
local gone_in = {}
local function drop(rids)
  local locs = redis.call('HMGET', KEYS[2], unpack(rids))
  local olds = {}
  for j, loc in ipairs(locs) do
    if loc then
      local b = string.match(loc, '^%d+:%d+%-%d+:([^:]+):')
      if b then
        gone_in[b] = (gone_in[b] or 0) + 1
      else
        olds[#olds + 1] = old_prefix .. rids[j]
      end
    end
  end
  redis.call('HDEL', KEYS[2], unpack(rids))
  if #olds > 0 then redis.call('DEL', unpack(olds)) end
end

local trimmed = {0, 0, 0}
for k = 1, 3 do
  if added[k] > 0 then
    local len = redis.call('XLEN', KEYS[6 + k])
    if len > maxlen + slack then
      -- Trim in amortised steps (like MAXLEN ~), but know exactly which entries go: their
      -- records' index entries and payloads go with them.
      local excess = len - maxlen
      local gone = redis.call('XRANGE', KEYS[6 + k], '-', '+', 'COUNT', excess)
      local rids = {}
      for j, e in ipairs(gone) do
        local h = e[2][2]
        rids[#rids + 1] = string.sub(h, 1, (string.find(h, HS, 1, true) or (#h + 1)) - 1)
        if #rids == 500 or j == #gone then
          drop(rids)
          rids = {}
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
for b, n_gone in pairs(gone_in) do
  if redis.call('HINCRBY', KEYS[10], b, -n_gone) <= 0 then
    redis.call('HDEL', KEYS[10], b)
    redis.call('DEL', blob_prefix .. b)
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

for f, c in pairs(counts) do redis.call('HINCRBY', KEYS[3], f, c) end
if dups > 0 then redis.call('HINCRBY', KEYS[3], '!dup', dups) end
if lseq >= 0 then redis.call('SET', KEYS[1], string.format('%d-%d', lms, lseq)) end
for k = 1, 10 do redis.call('EXPIRE', KEYS[k], ttl) end
for key, _ in pairs(touched) do redis.call('EXPIRE', key, ttl) end
return {table.concat(out), trimmed[1], trimmed[2], trimmed[3], dropped_rounds}
"""
