-- docs/neovim.md's set-up in a real Neovim, headless:
--   nvim --headless --clean -l neovim_doc.lua SNIPPET.lua FILE.cu RESULTS.json
-- SNIPPET is the page's Lua blocks as written there (test_neovim_doc.py extracts them); this
-- script only runs it, opens FILE as a user would, and writes what it saw to RESULTS for pytest.
local snippet, file, out = arg[1], arg[2], arg[3]
local results, finish, step = dofile(vim.fs.dirname(arg[0]) .. "/neovim_steps.lua")(out)

local loaded, problem = pcall(dofile, snippet)
results.snippet_error = (not loaded) and tostring(problem) or vim.NIL
if not loaded then
  finish(false)
end

vim.cmd.edit(file)
results.filetype = vim.bo.filetype
local client
step("attached", 15000, function()
  client = vim.lsp.get_clients({ name = "optiml", bufnr = 0 })[1]
  return client ~= nil and client.initialized
end)
results.cmd = client.config.cmd
results.root_dir = client.config.root_dir
results.init_options = client.config.init_options
results.inlay_hints_enabled = vim.lsp.inlay_hint.is_enabled({ bufnr = 0 })
results.commands = vim.tbl_keys(vim.api.nvim_get_commands({}))

local function spec_errors()
  local found = {}
  for _, d in ipairs(vim.diagnostic.get(0)) do
    if d.source == "optiml" and d.severity == vim.diagnostic.severity.ERROR then
      table.insert(found, { lnum = d.lnum, col = d.col, message = d.message })
    end
  end
  return found
end
step("spec error shown", 15000, function()
  return #spec_errors() > 0
end)
results.spec_errors = spec_errors()

-- The compile that follows the open: its figures as inlay hints (the snippet enables them).
step("inlay hint after the compile", 60000, function()
  return #vim.lsp.inlay_hint.get({ bufnr = 0 }) > 0
end)
results.hints = {}
for _, h in ipairs(vim.lsp.inlay_hint.get({ bufnr = 0 })) do
  table.insert(results.hints, h.inlay_hint.label)
end

-- K on the good kernel's name: the hover the server answers.
local line = vim.fn.search("__global__ void scale", "n")
local col = vim.fn.getline(line):find("scale", 1, true)
local hover = vim.lsp.buf_request_sync(0, "textDocument/hover", {
  textDocument = { uri = vim.uri_from_bufnr(0) },
  position = { line = line - 1, character = col },
}, 10000)
local answer = hover and hover[client.id] and hover[client.id].result
results.hover = answer and answer.contents.value or vim.NIL
finish(true)
