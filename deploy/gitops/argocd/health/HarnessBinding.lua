-- Argo CD health of a harness-engine.dev HarnessBinding (docs/install.md, "GitOps").
-- Deleting or not yet observed: Progressing. Stalled=True, lifecycle failed or a
-- profile that refuses the binding: Degraded. Hibernated: Suspended (the next bind
-- resumes it). Ready=True: Healthy. Anything else: Progressing, with Ready's message.
local hs = { status = "Progressing", message = "waiting for the operator to report status" }
if obj.metadata.deletionTimestamp ~= nil then
  hs.message = "deleting: the operator is releasing the sandbox claim"
  return hs
end
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conditions[c.type] = c
  end
end
local ready = conditions["Ready"]
local stalled = conditions["Stalled"]
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end
if obj.status.lifecycle == "failed" or (ready ~= nil and ready.status == "False" and ready.reason == "ProfileNotAccepted") then
  hs.status = "Degraded"
  local accepted = conditions["ProfileAccepted"]
  if accepted ~= nil and accepted.status == "False" then
    hs.message = accepted.reason .. ": " .. accepted.message
  elseif ready ~= nil then
    hs.message = ready.reason .. ": " .. ready.message
  else
    hs.message = "the binding cannot make progress"
  end
  return hs
end
local hibernated = conditions["Hibernated"]
if obj.status.lifecycle == "hibernated" or (hibernated ~= nil and hibernated.status == "True") then
  hs.status = "Suspended"
  hs.message = "hibernated: the next bind resumes the sandbox"
  return hs
end
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end
local reconciling = conditions["Reconciling"]
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.reason .. ": " .. reconciling.message
elseif ready ~= nil then
  hs.message = ready.reason .. ": " .. ready.message
end
return hs
