-- Argo CD health check of rocmtrain.dev/RocmTrainingJob (Lua 5.1, as Argo CD runs it).
-- Install it under the key resource.customizations.health.rocmtrain.dev_RocmTrainingJob of
-- argocd-cm: argocd-cm-patch.yaml in this folder carries it (see README.md, "GitOps health").
--   Healthy      Running (and not Stalled), Succeeded
--   Progressing  no status yet, a spec generation not yet acted on, Pending, Initializing
--   Degraded     Failed; Running but Stalled; Pending and Unschedulable or KubeRayMissing
--   Suspended    Queued (waiting for Kueue to admit it), Suspended (spec.suspend)
local hs = {}

local function condition(kind)
  if obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == kind then
        return c
      end
    end
  end
  return nil
end

local function is_true(kind)
  local c = condition(kind)
  return c ~= nil and c.status == "True"
end

local function message(kind, default)
  local c = condition(kind)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return default
end

local function progress()
  local p = obj.status.progress
  if p == nil or p.percent == nil then
    return "training"
  end
  local text = string.format("training: %.0f%%", p.percent)
  if p.step ~= nil and p.totalSteps ~= nil then
    text = text .. string.format(" (step %d of %d)", p.step, p.totalSteps)
  end
  return text
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the rocm-train operator"
  return hs
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to act on generation " .. generation
  return hs
end

local phase = obj.status.phase
if phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = message("Succeeded", "Training succeeded")
elseif phase == "Failed" then
  hs.status = "Degraded"
  hs.message = message("Failed", "Training failed")
elseif phase == "Running" then
  if is_true("Stalled") then
    hs.status = "Degraded"
    hs.message = message("Stalled", "No progress")
  else
    hs.status = "Healthy"
    hs.message = progress()
  end
elseif phase == "Queued" or phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = message("Ready", phase)
elseif is_true("Unschedulable") then
  hs.status = "Degraded"
  hs.message = message("Unschedulable", "No node can run the workers")
elseif is_true("KubeRayMissing") then
  hs.status = "Degraded"
  hs.message = message("KubeRayMissing", "KubeRay is not installed")
else
  hs.status = "Progressing"
  hs.message = message("Ready", phase)
end
return hs
