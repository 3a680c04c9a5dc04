-- wrk script for the soak: three GETs to every POST with a 4 KiB body, all to `api`.
local body = string.rep("x", 4096)
local n = 0

request = function()
  n = n + 1
  if n % 4 == 0 then
    return wrk.format("POST", "/echo", { ["Host"] = "api" }, body)
  end
  return wrk.format("GET", "/", { ["Host"] = "api" })
end
