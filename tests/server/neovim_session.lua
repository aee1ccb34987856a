-- A Neovim session against the OptiML server, headless:
--   nvim --headless --clean -l neovim_session.lua PYTHON FILE.cu RESULTS.json
-- It opens FILE (a kernel without a spec), applies "Add OptiML spec", breaks and fixes the spec,
-- saves, waits for the compile's inlay hints and writes what it saw to RESULTS for pytest.
local python, file, out = arg[1], arg[2], arg[3]
local results, finish, step = dofile(vim.fs.dirname(arg[0]) .. "/neovim_steps.lua")(out)

local function text()
  return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
end

vim.cmd.edit(file)
local published = 0
local client_id = vim.lsp.start({
  name = "optiml",
  cmd = { python, "-m", "server" },
  root_dir = vim.fs.dirname(file),
  init_options = { arch = "sm_90" },
  handlers = {
    ["textDocument/publishDiagnostics"] = function(err, result, ctx)
      published = published + 1
      return vim.lsp.diagnostic.on_publish_diagnostics(err, result, ctx)
    end,
  },
})
local client = vim.lsp.get_client_by_id(client_id)
step("attached", 10000, function()
  return client.initialized
end)
vim.lsp.inlay_hint.enable(true, { bufnr = 0 })
step("diagnostics published on open", 10000, function()
  return published > 0
end)

-- The cursor inside the kernel's body, then the code action, applied as a user picks it.
local kernel_line = vim.fn.search("__global__ void saxpy", "n")
vim.api.nvim_win_set_cursor(0, { kernel_line + 2, 4 })
vim.lsp.buf.code_action({
  apply = true,
  filter = function(action)
    return action.title == "Add OptiML spec for `saxpy`"
  end,
})
step("spec inserted", 10000, function()
  return text():find("@optiml", 1, true) ~= nil
end)
results.text_with_spec = text()

-- Break the spec in place (an incremental change), then fix it.
local role_line = vim.fn.search("y: inout", "n")
local role_col = vim.fn.getline(role_line):find("inout", 1, true) - 1
vim.api.nvim_buf_set_text(0, role_line - 1, role_col, role_line - 1, role_col + 5, { "inoot" })
step("spec error shown", 10000, function()
  return #vim.diagnostic.get(0, { severity = vim.diagnostic.severity.ERROR }) > 0
end)
local d = vim.diagnostic.get(0, { severity = vim.diagnostic.severity.ERROR })[1]
results.spec_error = { lnum = d.lnum, col = d.col, end_col = d.end_col, message = d.message }
results.role = { lnum = role_line - 1, col = role_col }
vim.api.nvim_buf_set_text(0, role_line - 1, role_col, role_line - 1, role_col + 5, { "inout" })
step("spec error cleared", 10000, function()
  return #vim.diagnostic.get(0, { severity = vim.diagnostic.severity.ERROR }) == 0
end)

vim.cmd.write()
-- The compile on open (no spec yet: no launch, so no occupancy) may have shown its hint already;
-- the saved file's compile, with the spec's launch, replaces it with one that has an occupancy.
step("inlay hint after the compile", 60000, function()
  for _, h in ipairs(vim.lsp.inlay_hint.get({ bufnr = 0 })) do
    if h.inlay_hint.label:find("occupancy", 1, true) then
      return true
    end
  end
  return false
end)
results.hints = {}
for _, h in ipairs(vim.lsp.inlay_hint.get({ bufnr = 0 })) do
  local label = h.inlay_hint.label
  table.insert(results.hints, { label = label, line = h.inlay_hint.position.line })
end
results.signature_line = vim.fn.search("__global__ void saxpy", "n") - 1

local name_line = results.signature_line
local name_col = vim.fn.getline(name_line + 1):find("saxpy", 1, true) + 1
local hover = vim.lsp.buf_request_sync(0, "textDocument/hover", {
  textDocument = { uri = vim.uri_from_bufnr(0) },
  position = { line = name_line, character = name_col },
}, 5000)
results.hover = hover[client_id].result.contents.value
finish(true)
