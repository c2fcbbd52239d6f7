-- wrk: POST /v1/check with an inline quota, keys drawn uniformly from SLIDEGATE_KEYS (default 1).
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local keys = tonumber(os.getenv("SLIDEGATE_KEYS") or "1")
local limit = os.getenv("SLIDEGATE_LIMIT") or "100"
local window = os.getenv("SLIDEGATE_WINDOW") or "60s"
request = function()
  local body = '{"key":"bench:' .. math.random(0, keys - 1) .. '","limit":' .. limit .. ',"window":"' .. window .. '"}'
  return wrk.format(nil, nil, nil, body)
end
