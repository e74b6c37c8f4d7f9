-- soak.lua: wrk script for tests/soak/soak.sh: a fixed mix per connection of
-- GET /v1/blobs/{digest} (12 of 20), POST /v1/lookup (5 of 20, 8 present
-- keys and 2 absent) and PUT /v1/blobs/{digest} (3 of 20) with a body no
-- other request sends (phase, thread and a counter in it; its SHA-256 is
-- computed here). Counts responses per status; done() prints one line
--   SOAK_STATUS 200=n 201=n ...
-- and one line SOAK_ERRORS connect read write status timeout.
-- Usage: wrk ... -s soak.lua URL -- BLOBS_FILE KEYS_FILE PHASE
local bit = require("bit")
local band, bor, bxor, bnot = bit.band, bit.bor, bit.bxor, bit.bnot
local rshift, lshift, ror, tobit, tohex =
  bit.rshift, bit.lshift, bit.ror, bit.tobit, bit.tohex

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
  0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
  0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
  0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
  0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
  0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

-- SHA-256 of a string (under 512 MiB), lowercase hex.
local function sha256(msg)
  local len = #msg
  local bits = len * 8
  msg = msg .. "\128" .. string.rep("\0", (64 - (len + 9) % 64) % 64) ..
    "\0\0\0\0" .. string.char(band(rshift(bits, 24), 255),
      band(rshift(bits, 16), 255), band(rshift(bits, 8), 255), band(bits, 255))
  local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
  local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
  local w = {}
  for off = 1, #msg, 64 do
    for i = 0, 15 do
      local b1, b2, b3, b4 = string.byte(msg, off + i * 4, off + i * 4 + 3)
      w[i] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
    end
    for i = 16, 63 do
      local x, y = w[i - 15], w[i - 2]
      local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
      local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i = 0, 63 do
      local S1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
      local ch = bxor(band(e, f), band(bnot(e), g))
      local t1 = tobit(h + S1 + ch + K[i + 1] + w[i])
      local S0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
      local maj = bxor(band(a, b), band(a, c), band(b, c))
      local t2 = tobit(S0 + maj)
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
    end
    h0, h1, h2, h3 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d)
    h4, h5, h6, h7 = tobit(h4 + e), tobit(h5 + f), tobit(h6 + g), tobit(h7 + h)
  end
  return tohex(h0, 8) .. tohex(h1, 8) .. tohex(h2, 8) .. tohex(h3, 8) ..
    tohex(h4, 8) .. tohex(h5, 8) .. tohex(h6, 8) .. tohex(h7, 8)
end

local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

local function read_lines(path)
  local t = {}
  local f = assert(io.open(path, "r"))
  for line in f:lines() do
    if #line > 0 then table.insert(t, line) end
  end
  f:close()
  return t
end

local blobs, keys, phase, counter, pad
local absent = string.rep("0", 63)

function init(args)
  blobs = read_lines(args[1])
  keys = read_lines(args[2])
  phase = args[3] or "main"
  counter = 0
  statuses = {}
  pad = string.rep("k", 400)
  -- self-check of the hash (the SHA-256 of "abc")
  assert(sha256("abc") ==
    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
end

local json_headers = { ["Content-Type"] = "application/json" }
local octet_headers = { ["Content-Type"] = "application/octet-stream" }

function request()
  counter = counter + 1
  local slot = counter % 20
  if slot < 12 then
    local d = blobs[(counter * 7 + id) % #blobs + 1]
    return wrk.format("GET", "/v1/blobs/" .. d)
  elseif slot < 17 then
    local parts = {}
    for i = 1, 8 do
      parts[i] = '"' .. keys[(counter + i * 3 + id) % #keys + 1] .. '"'
    end
    parts[9] = '"' .. absent .. (counter % 10) .. '"'
    parts[10] = '"' .. absent .. "f" .. '"'
    return wrk.format("POST", "/v1/lookup", json_headers,
      '{"keys":[' .. table.concat(parts, ",") .. "]}")
  else
    local body = "kcache soak " .. phase .. " thread " .. id .. " put " ..
      counter .. " " .. pad
    return wrk.format("PUT", "/v1/blobs/" .. sha256(body), octet_headers, body)
  end
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    local st = t:get("statuses")
    for code, n in pairs(st) do
      total[code] = (total[code] or 0) + n
    end
  end
  local codes = {}
  for code in pairs(total) do table.insert(codes, code) end
  table.sort(codes)
  local out = {}
  for _, code in ipairs(codes) do
    table.insert(out, code .. "=" .. total[code])
  end
  io.write("SOAK_STATUS ", table.concat(out, " "), "\n")
  local e = summary.errors
  io.write(string.format("SOAK_ERRORS %d %d %d %d %d\n", e.connect, e.read,
    e.write, e.status, e.timeout))
  io.write(string.format("SOAK_SUMMARY %d %d %d\n", summary.requests,
    summary.duration, summary.bytes))
end
