-- Argo CD health of a harness-engine.dev MemoryPolicy (docs/install.md, "GitOps").
-- Deleting or not yet observed: Progressing. Stalled=True (the policy breaks a rule
-- the operator checks, such as writing a scope it cannot read): Degraded. Ready=True
-- (valid, including a policy that disables memory on purpose): Healthy. Anything else:
-- Progressing, with Ready's message.
local hs = { status = "Progressing", message = "waiting for the operator to report status" }
if obj.metadata.deletionTimestamp ~= nil then
  hs.message = "deleting"
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
