-- prelude.lua: the first lines of the fixed window and bucket scripts
-- (prelude.lua + fixedwindow.lua; prelude.lua + leakybucket.lua or
-- tokenbucket.lua + gcra.lua). They do not join common.lua: the whole chunk
-- runs on every call, and each of its helpers would cost a closure per
-- call. They follow its conventions (ARGV[1] now in Unix µs or "" for the
-- server's TIME, ARGV[2] n; the reply of six integers; the NOTOURS error)
-- with statements: what is here sets locals, and defines no function.

-- Now, from ARGV or the server's TIME. Writing after TIME needs effects
-- replication, the default since Redis 5. t keeps TIME's reply, two
-- decimal strings (seconds, µs), for a reply that gives now as text.
local now, t
if ARGV[1] == '' then
  t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
else
  now = ARGV[1] + 0
end
-- n is 1 on most calls: comparing ARGV[2] with '1' (interned strings, one
-- pointer comparison) spares converting it.
local n = 1
if ARGV[2] ~= '1' then n = ARGV[2] + 0 end

-- The end of a NOTOURS error (not_ours in common.lua): 'NOTOURS holds ' ..
-- what .. NOT_OURS. Nothing has been written when it is returned. It does
-- not quote the key: the Go side names it, bounded.
local NOT_OURS = ', not redlimit state; it was left unchanged'
