-- What the headless Neovim sessions of these tests share: a results table written to OUT as JSON
-- for pytest, and steps that wait for a condition (a step that times out ends the session).
--   local results, finish, step = dofile(vim.fs.dirname(arg[0]) .. "/neovim_steps.lua")(out)
return function(out)
  local results = { steps = {} }

  local function finish(ok)
    results.ok = ok
    local f = assert(io.open(out, "w"))
    f:write(vim.json.encode(results))
    f:close()
    vim.cmd("qall!")
  end

  local function step(name, timeout_ms, condition)
    local ok = vim.wait(timeout_ms, condition, 50)
    table.insert(results.steps, { name = name, ok = ok })
    if not ok then
      finish(false)
    end
  end

  return results, finish, step
end
