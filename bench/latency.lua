-- rw.lua (shared/tools/bench) plus a pause before each request, so that wrk offers a
-- fixed fraction of the saturation load and its latency percentiles show the added
-- latency rather than queueing. RW_LUA is the path of rw.lua; RW_DELAY_MS the pause.
dofile(os.getenv("RW_LUA"))
local pause = tonumber(os.getenv("RW_DELAY_MS") or "0")
function delay()
   return pause
end
