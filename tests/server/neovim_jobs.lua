-- A Neovim session that optimizes a kernel with the OptiML server and accepts the proposal,
-- headless:
--   nvim --headless --clean -l neovim_jobs.lua RESULTS.json FILE.cu TIMEOUT_S SERVER_CMD...
-- It opens FILE (saxpy with its spec), runs the code action "Optimize kernel `saxpy`" (settings:
-- evaluations = 8, or the JSON object in $OPTIML_NVIM_INIT_OPTIONS), waits for the job's
-- progress to end, refreshes the code lenses, runs the Accept lens as a user picks it from
-- `vim.lsp.codelens.run()`, checks that the buffer changed and the file did not, writes the
-- buffers (`:wall`), and writes what it saw to RESULTS for pytest.
-- With $OPTIML_NVIM_FLOW=generate it runs "Generate kernel from comment" on the line that
-- $OPTIML_NVIM_LINE finds (a `search()` pattern) instead, and the lenses are over that comment.
local out, file, timeout_ms = arg[1], arg[2], tonumber(arg[3]) * 1000
local generating = os.getenv("OPTIML_NVIM_FLOW") == "generate"
local job_title = generating and "^OptiML: generating" or "^OptiML: optimizing"
local action_title = generating and "Generate kernel from comment" or "Optimize kernel `saxpy`"
local cmd = {}
for i = 4, #arg do
  table.insert(cmd, arg[i])
end
local results, finish, step = dofile(vim.fs.dirname(arg[0]) .. "/neovim_steps.lua")(out)
results.progress, results.confirmations, results.messages = {}, {}, {}

local function read(path)
  local f = assert(io.open(path, "r"))
  local text = f:read("*a")
  f:close()
  return text
end

local function text()
  return table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n") .. "\n"
end

-- A user who answers Yes to a confirmation, and picks "Accept" among the lenses of a line.
vim.fn.confirm = function(message)
  table.insert(results.confirmations, message)
  return 1
end
vim.ui.select = function(items, opts, on_choice)
  for i, item in ipairs(items) do
    if opts.format_item(item):find("^Accept") then
      return on_choice(item, i)
    end
  end
  on_choice(nil, nil)
end

-- Job progress, as a statusline plugin sees it.
local titles, ended = {}, {}
vim.api.nvim_create_autocmd("LspProgress", {
  callback = function(ev)
    local token, value = ev.data.params.token, ev.data.params.value
    if value.kind == "begin" then
      titles[token] = value.title
    end
    local title = titles[token] or ""
    if title:find(job_title) then
      table.insert(results.progress, {
        kind = value.kind,
        title = value.title,
        message = value.message,
        percentage = value.percentage,
        cancellable = value.cancellable,
      })
      if value.kind == "end" then
        ended[token] = value.message or ""
      end
    end
  end,
})

vim.cmd.edit(file)
local original = read(file)
local published = 0
local client_id = vim.lsp.start({
  name = "optiml",
  cmd = cmd,
  root_dir = vim.fs.dirname(file),
  init_options = vim.json.decode(os.getenv("OPTIML_NVIM_INIT_OPTIONS") or '{"evaluations": 8}'),
  handlers = {
    ["textDocument/publishDiagnostics"] = function(err, result, ctx)
      published = published + 1
      return vim.lsp.diagnostic.on_publish_diagnostics(err, result, ctx)
    end,
    ["window/showMessage"] = function(_, result)
      table.insert(results.messages, result.message)
    end,
  },
})
local client = vim.lsp.get_client_by_id(client_id)
step("attached", 10000, function()
  return client.initialized
end)
step("diagnostics published on open", 10000, function()
  return published > 0
end)

local at = generating and vim.fn.search(os.getenv("OPTIML_NVIM_LINE"), "n")
  or vim.fn.search("__global__ void saxpy", "n") + 2
vim.api.nvim_win_set_cursor(0, { at, 4 })
vim.lsp.buf.code_action({
  apply = true,
  filter = function(action)
    return action.title == action_title
  end,
})
step("the job ended", timeout_ms, function()
  return next(ended) ~= nil
end)
results["end"] = select(2, next(ended))

vim.lsp.codelens.refresh({ bufnr = 0 })
step("code lenses", 10000, function()
  return #vim.lsp.codelens.get(0) > 0
end)
results.lenses = {}
for _, lens in ipairs(vim.lsp.codelens.get(0)) do
  table.insert(results.lenses, { title = lens.command.title, line = lens.range.start.line })
end

vim.api.nvim_win_set_cursor(0, { at, 4 })
vim.lsp.codelens.run()
step("the proposal applied to the buffer", 10000, function()
  return text() ~= original
end)
results.accepted = text()
results.modified = vim.bo.modified
results.disk_after_accept = read(file)
step("the lenses gone", 10000, function()
  return #vim.lsp.codelens.get(0) == 0
end)
vim.cmd("wall")
results.disk_after_write = read(file)
finish(true)
