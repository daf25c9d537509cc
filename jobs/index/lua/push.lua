-- push.lua: a leased job's broker message, pushed by the script that leases it (prepended to
-- hand_over.lua and offer.lua).

-- Push the message of lease (as lease_next returns it) to the list key: Celery's message
-- (protocol 2) as kombu's Redis transport stores it, from envelope (jobs.index.values
-- .MessagePush) with its own fields filled in: the task's id names the job, its attempt and
-- this moment; the body, unencoded JSON, is [args, kwargs, embed] with args [job, attempt,
-- when leased(, token)]; routing_key ('' keep the envelope's) is the queue's name.
local function push_message(key, envelope, routing_key, lease, ttl, now, token)
  local at = tonumber(lease[6]) - ttl
  local id = lease[1] .. '.' .. lease[5] .. '.' .. string.format('%.6f', now)
  local message = cjson.decode(envelope)
  local headers, properties = message['headers'], message['properties']
  headers['id'], headers['root_id'] = id, id
  local args, repr = {lease[1], tonumber(lease[5]), at}, string.format('%.6f', at)
  if token ~= nil and token ~= '' then
    args[4], repr = token, repr .. ", '" .. token .. "'"
  end
  headers['argsrepr'] = "['" .. lease[1] .. "', " .. lease[5] .. ', ' .. repr .. ']'
  properties['correlation_id'], properties['delivery_tag'] = id, id
  if routing_key ~= nil and routing_key ~= '' then
    properties['delivery_info']['routing_key'] = routing_key
  end
  message['body'] = cjson.encode({args, cjson.decode('{}'), message['body']})
  redis.call('LPUSH', key, cjson.encode(message))
end
