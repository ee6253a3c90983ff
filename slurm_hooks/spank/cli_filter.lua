--[[
cli_filter.lua for Medic's --resilient (CliFilterPlugins=cli_filter/lua; Slurm reads the
cli_filter.lua next to slurm.conf; Debian's slurm-wlm-basic-plugins ships cli_filter_lua.so,
built against Lua 5.1).

The medic_resilient SPANK plugin's --resilient callback exports MEDIC_RESILIENT_REQUEST=N
(N already resolved: a bare --resilient gives the default) in the submitting
sbatch/srun/salloc. Before the job is submitted, this script turns that into
  --requeue (sbatch only: srun and salloc have no such option, and interactive jobs are
  never requeued) and
  the comment word medic:resilient=N, replacing an old tag and keeping the rest.
Jobs submitted without --resilient are left alone. Keep in sync with slurm_hooks/resilient.py.
--]]

local REQUEST_ENV = "MEDIC_RESILIENT_REQUEST"
local TAG_PREFIX = "medic:resilient="

-- N when this very command was given --resilient, else nil. options.spank (Slurm 22.05
-- has it) says whether the option was given here, so a MEDIC_RESILIENT_REQUEST exported by
-- someone else is ignored; the variable carries the value the plugin resolved.
local function requested(options)
	local spank = options["spank"]
	if type(spank) == "table" and type(spank["medic_resilient"]) == "table"
		and spank["medic_resilient"]["resilient"] == nil then
		return nil
	end
	local value = os.getenv(REQUEST_ENV)
	if value == nil or not string.match(value, "^%d+$") then
		return nil
	end
	return value
end

local function tagged(comment, n)
	local words = {}
	for word in string.gmatch(comment or "", "%S+") do
		if string.sub(word, 1, string.len(TAG_PREFIX)) ~= TAG_PREFIX then
			table.insert(words, word)
		end
	end
	table.insert(words, TAG_PREFIX .. n)
	return table.concat(words, " ")
end

function slurm_cli_setup_defaults(options, early_pass)
	return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, jobid, stepid)
	return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, offset)
	local n = requested(options)
	if n == nil then
		return slurm.SUCCESS
	end
	if options["type"] == "sbatch" then
		-- A bare --requeue: "" is its empty argument. 22.05 and 24.11 ignore the value;
		-- 26.05 takes an optional one ("expedite") and logs "Invalid --requeue
		-- specification" for any other, such as "true".
		options["requeue"] = ""
	end
	options["comment"] = tagged(options["comment"], n)
	return slurm.SUCCESS
end
